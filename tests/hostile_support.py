"""Helpers of the tests that pour junk on a private platform: processes, their metrics,
condition waits that notice a process exiting, and a reader of the dead letters."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from gpulens.config import GPULensSettings
from gpulens.schemas.model.models import DeadLetter
from gpulens.schemas.model.topics import DLQ
from gpulens.schemas.wire.codec import AvroCodec


def start(config: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``gpulens --config config args``, its stderr appended to ``log``."""
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "gpulens", "--config", str(config), *args],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def metric(port: int, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (with ``labels``) a process serves (0 when it is not up yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def wait(
    condition: Callable[[], bool], timeout: float, what: str, *processes: subprocess.Popen[bytes]
) -> None:
    """Until ``condition``; fails at once if one of ``processes`` exited, or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [p.args for p in processes if p.poll() is not None]
        assert not dead, f"exited while waiting for {what}: {dead}"
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def peak_rss_mb(pid: int) -> float:
    """The peak resident set of a running process (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


class DeadLetterReader:
    """Reads the committed dead letters of a private platform as they arrive: every one's
    headers (reason, source, consumer), and every ``decode_every``-th one decoded whole."""

    def __init__(self, settings: GPULensSettings, codec: AvroCodec, *, decode_every: int = 1) -> None:
        self._consumer = Consumer(
            settings.kafka.librdkafka(
                **{"group.id": "dlq-reader", "isolation.level": "read_committed", "enable.auto.commit": False}
            )
        )
        self._consumer.assign([TopicPartition(DLQ.name, 0, 0)])
        self._codec, self._decode_every = codec, decode_every
        self.headers: list[dict[str, bytes]] = []
        self.letters: list[DeadLetter] = []

    def read(self) -> int:
        for message in self._consumer.consume(20_000, 0.5):
            if message.error() is None:
                if len(self.headers) % self._decode_every == 0:
                    self.letters.append(self._codec.decode(DLQ, message.value() or b""))
                self.headers.append(dict(message.headers() or []))
        return len(self.headers)

    def close(self) -> None:
        self._consumer.close()
