"""A table's description, written once: its columns in order and where each value is taken.

A :class:`Layout` names its table (or a state table and its history, which share columns)
and lists the columns; the column tuple the inserts name and the function that turns a
record into rows both derive from that list, so a column is added in one place (and in the
migration that creates it). The migrations stay the schema of record: a test compares every
layout with the tables they create.

Rows are built on the sink's hot path, so each layout is compiled once, when it is made, into
the function a hand-written mapper would be: one tuple display such as ``(record.cluster,
record.type.value, value_0, ..., version_)``, as :mod:`dataclasses` and
:func:`collections.namedtuple` write their methods. Interpreting the list per row
(``attrgetter`` and ``itemgetter`` calls) cost 20-30 % more per node or pod record than the
hand-written mappers this replaced; the compiled functions cost 8-35 % less (a device
inventory the same; a container event, whose devices are read for two tables, 70-85 % more,
2.5 µs). :attr:`Layout.source` shows the source; the attribute paths put in it are checked
first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeAlias, TypeVar

from gpulens.schemas.model.models import Record

__all__ = ["VERSION", "Column", "Item", "Layout", "Row", "Table", "items", "version"]

R = TypeVar("R", bound=Record)

Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Table:
    """A table the sink writes: its name and the columns of its rows, in order."""

    name: str
    columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Item:
    """A column taken from each item of the layout's ``each`` (one row per item), not the record."""

    name: str
    path: str
    """The item's attribute (dotted: ``kind.value``)."""


@dataclass(frozen=True, slots=True)
class _Version:
    name: str


VERSION = _Version("version")
"""The ``version`` column of state tables: :func:`version` of the record's event time and offset."""

Column: TypeAlias = str | tuple[str, str | Callable[[R], object]] | Item | _Version
"""One column: a record attribute of the same name; ``(name, attribute)`` (dotted:
``type.value``); ``(name, function of the record)``; an :class:`Item` column; :data:`VERSION`."""


def items(*columns: str | tuple[str, str]) -> tuple[Item, ...]:
    """:class:`Item` columns: an item attribute of the same name, or ``(name, attribute)``."""
    return tuple(Item(c, c) if isinstance(c, str) else Item(*c) for c in columns)


def version(event_time: datetime, offset: int) -> int:
    """The ReplacingMergeTree version of a state row: event time in ms, then the Kafka offset."""
    return (int(event_time.timestamp() * 1000) << 64) | offset


_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class Layout(Generic[R]):
    """The rows records of type ``R`` become in one table, or in a state table and its history.

    Without ``each``, a record is one row, in every table of ``tables``; with it, one row per
    item of ``each(record)``, in the one table (:class:`Item` columns are read from the item,
    the others from the record).
    """

    def __init__(
        self,
        record: type[R],
        tables: str | tuple[str, ...],
        *columns: Column[R],
        each: Callable[[R], Iterable[Any]] | None = None,
    ) -> None:
        if each is None and any(isinstance(column, Item) for column in columns):
            raise ValueError(f"{tables}: Item columns need each=")
        if each is not None and not isinstance(tables, str):
            raise ValueError(f"{tables}: a layout with each= makes rows of one table")
        names = tuple(_named(column)[0] for column in columns)
        self.record = record
        """The record type the layout takes."""
        self.tables = tuple(Table(t, names) for t in ((tables,) if isinstance(tables, str) else tables))
        """The tables its rows go to."""
        self.source, scope = _source(columns, len(self.tables), each is not None)
        """The source of :attr:`pairs`."""
        scope |= {"version": version, "each": each} | {f"table_{n}": t for n, t in enumerate(self.tables)}
        exec(compile(self.source, f"<layout of {self.tables[0].name}>", "exec"), scope)
        self.pairs: Callable[[R, int], list[tuple[Table, Row]]] = scope["pairs"]
        """The rows a record read at an offset becomes, with their tables."""


def _named(column: Column[R]) -> tuple[str, str | Callable[[R], object] | Item | _Version]:
    """A column's name and where its value is taken."""
    if isinstance(column, str):
        return column, column
    if isinstance(column, tuple):
        return column
    return column.name, column


def _source(columns: tuple[Column[R], ...], tables: int, each: bool) -> tuple[str, dict[str, Any]]:
    """The source of a layout's function ``pairs(record, offset)`` and the computed columns'
    functions it calls, by their names in it (``table_N``, ``version`` and ``each`` are the
    caller's to add)."""
    once: list[str] = []  # values of the record computed before its rows are made
    values: list[str] = []  # each column's value, as the source reads it
    functions: dict[str, Any] = {}
    for column in columns:
        take = _named(column)[1]
        if isinstance(take, Item):
            values.append(f"item.{_path(take.path)}")
        elif isinstance(take, _Version):
            once.append("version_ = version(record.event_time, offset)")
            values.append("version_")
        elif isinstance(take, str):
            values.append(f"record.{_path(take)}")
        else:
            n = len(functions)
            functions[f"take_{n}"] = take
            once.append(f"value_{n} = take_{n}(record)")
            values.append(f"value_{n}")
    row = f"({', '.join(values)},)"
    if each:
        made = [f"return [(table_0, {row}) for item in each(record)]"]
    else:
        made = [f"row = {row}", f"return [{', '.join(f'(table_{n}, row)' for n in range(tables))}]"]
    return "def pairs(record, offset):\n" + "".join(f"    {line}\n" for line in [*once, *made]), functions


def _path(path: str) -> str:
    """``path``, checked to be an attribute path before it goes into generated source."""
    if _PATH.fullmatch(path) is None:
        raise ValueError(f"{path!r} is not an attribute path")
    return path
