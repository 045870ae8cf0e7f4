"""The Python module the wire's two compilers generate per record model, and running it.

:mod:`gpulens.schemas.wire.compiled_reader` and :mod:`gpulens.schemas.wire.compiled_writer`
each write one function per record model (a nested record's first, called by name), refer to
the objects they need as module constants, and name their locals uniquely; what differs is
which models they take and what a function's body does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from gpulens.schemas.model.models import Record

__all__ = ["GeneratedSource"]


class GeneratedSource(ABC):
    """The generated module: its lines, the constants they name, one function per model."""

    prefix: str
    """Of each function's name, before the model's."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self._functions: dict[type[Record], str] = {}
        self._counter = 0

    def record(self, model: type[Record]) -> str:
        """The name of ``model``'s function, generated once (named before its body is, so a
        model nested in itself calls it)."""
        name = self._functions.get(model)
        if name is None:
            self._check(model)
            name = self._functions[model] = f"{self.prefix}{model.__name__}"
            self._define(model, name)
        return name

    @abstractmethod
    def _check(self, model: type[Record]) -> None:
        """Raise ``NotCompiled`` for a model this generator does not cover."""

    @abstractmethod
    def _define(self, model: type[Record], name: str) -> None:
        """Append the function ``name`` for ``model``."""

    def load(self, root: str, helpers: dict[str, Any], title: str) -> Any:
        """Run the module with ``helpers`` (and the constants) in its namespace; its ``root``."""
        namespace = {**helpers, **self.constants}
        exec(compile("\n".join(self.lines), title, "exec"), namespace)
        return namespace[root]

    def _constant(self, value: Any) -> str:
        self._counter += 1
        key = f"_c{self._counter}"
        self.constants[key] = value
        return key

    def _var(self) -> str:
        self._counter += 1
        return f"v{self._counter}"
