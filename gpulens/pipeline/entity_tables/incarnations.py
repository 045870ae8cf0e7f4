"""Incarnations of one `gpulens tables` process, and fencing what a killed one left open.

Every start is a new incarnation with transactional ids of its own (see exactly_once). The ids
it begins transactions under are appended to a ledger file in the process's data dir before
their first transaction; the next start aborts each one's open transaction (InitProducerId
under that id: the broker writes the abort marker, and read_committed readers of the state
topics move on) before the app starts, then begins a new ledger. The ids of a fenced
incarnation are never used again.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from confluent_kafka import Producer

from gpulens.schemas.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)


class Ledger:
    """The transactional ids of this incarnation, and of the ones before it until fenced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.incarnation = uuid.uuid4().hex[:12]

    def previous(self) -> list[str]:
        """Ids the earlier incarnations began transactions under (not fenced yet)."""
        if not self.path.exists():
            return []
        return sorted({line for line in self.path.read_text().splitlines() if line})

    def fence_previous(self, kafka: KafkaSettings) -> int:
        """Abort every open transaction of the earlier incarnations; returns how many ids."""
        previous = self.previous()
        if previous:
            log.info("tables: fencing %d transactional ids of earlier incarnations", len(previous))
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda tid: _fence(kafka, tid), previous))
        self.path.write_text("")
        return len(previous)

    def record(self, tids: Iterable[str]) -> None:
        """Note ``tids`` durably before any transaction begins under them."""
        with self.path.open("a") as ledger:
            ledger.writelines(f"{tid}\n" for tid in tids)
            ledger.flush()
            os.fsync(ledger.fileno())


def _fence(kafka: KafkaSettings, transactional_id: str) -> None:
    producer = Producer(kafka.producer(**{"transactional.id": transactional_id}))
    producer.init_transactions(30)
    producer.flush(30)
