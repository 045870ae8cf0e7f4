"""Table values: the public state topics' Avro bytes, and the workloads' internal JSON.

The tables hold values as the bytes their changelogs carry (the app's serializers are raw),
so a public table's changelog is the Confluent-framed Avro of today's state topics, encoded
under ``<topic>-value``, and the internal workload table is free to hold more than the
public WorkloadState (the watcher's status, which pods are active).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from dataclasses import asdict
from typing import Any

from gpulens.pipeline.state_tables import ActivePod, Workload
from gpulens.schemas.model.models import WorkloadStatus
from gpulens.schemas.model.topics import entity_key


def dump_workload(workload: Workload) -> bytes:
    """The internal changelog value of ``workload``."""
    return json.dumps(asdict(workload), separators=(",", ":")).encode()


def load_workload(data: bytes) -> Workload:
    """The workload whose internal changelog value is ``data``."""
    fields: dict[str, Any] = json.loads(data)
    fields["pods"] = {uid: ActivePod(**pod) for uid, pod in fields["pods"].items()}
    reported = fields["reported"]
    fields["reported"] = WorkloadStatus(reported) if reported is not None else None
    return Workload(**fields)


class WorkloadTable(MutableMapping[tuple[str, str], Workload]):
    """StateTables' workload store over a faust table of ``cluster/uid`` -> JSON bytes: every
    assignment is a changelog write, so the store survives restarts and moves with its partition."""

    def __init__(self, table: MutableMapping[bytes, bytes]) -> None:
        self._table = table

    def __getitem__(self, key: tuple[str, str]) -> Workload:
        return load_workload(self._table[entity_key(*key)])

    def get(self, key: tuple[str, str], default: Any = None) -> Any:
        data = self._table.get(entity_key(*key))
        return default if data is None else load_workload(data)

    def __setitem__(self, key: tuple[str, str], workload: Workload) -> None:
        self._table[entity_key(*key)] = dump_workload(workload)

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self._table[entity_key(*key)]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for key in self._table:
            cluster, _, uid = key.decode().partition("/")
            yield cluster, uid

    def __len__(self) -> int:
        return len(self._table)
