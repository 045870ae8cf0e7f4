"""Service logs stay bounded: a real child's output through the rotating writer, and the
platform's broker, registry and ClickHouse holder writing through it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gpulens.config import GPULensSettings
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.infra.log_writing import LogRotation
from gpulens.platform import BROKER, CLICKHOUSE, REGISTRY, manager

LINES = 50_000
CHATTY = f"""
import signal, sys
for i in range({LINES}):
    sys.stdout.write(f"line {{i:07d}}\\n")
sys.stdout.flush()
signal.pause()
"""
"""Writes LINES numbered lines, then waits to be stopped (as a service does)."""


def _writers_of(path: Path) -> list[int]:
    """Live processes whose command line names ``path`` (its log writer)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(path).encode() in cmdline:
                found.append(int(entry.name))
    return found


def _ends_with(log: Path, text: str) -> bool:
    """Whether ``log`` ends with ``text``; False while it is not there (a rotation moves it
    away, then the writer opens a new one)."""
    try:
        return log.read_text().endswith(text)
    except FileNotFoundError:
        return False


def test_a_chatty_service_keeps_bounded_logs_that_end_with_its_last_lines(tmp_path: Path) -> None:
    services = ServiceManager(tmp_path)
    rotation = LogRotation(max_bytes=20_000, backups=2)
    spec = ServiceSpec("chatty", [sys.executable, "-c", CHATTY], ready=lambda: True, log_rotation=rotation)
    services.start(spec)
    log = services.log_path("chatty")
    # the writer has exec'd, but the kernel may show its command line a moment later (seen once
    # empty under the full suite)
    deadline = time.monotonic() + 10
    while not _writers_of(log):
        assert time.monotonic() < deadline, "its output goes through a writer"
        time.sleep(0.05)
    last = f"line {LINES - 1:07d}\n"
    deadline = time.monotonic() + 30
    while not _ends_with(log, last):
        assert time.monotonic() < deadline, "the last line never reached the log"
        time.sleep(0.05)
    assert services.stop("chatty")
    # stop() reaps the writer once it wrote what was left, waiting 10 s at most: more under a
    # loaded suite, where it was once seen alive after stop() returned
    deadline = time.monotonic() + 30
    while _writers_of(log):
        assert time.monotonic() < deadline, "the writer ended with its service"
        time.sleep(0.1)

    kept = [log.with_name(f"{log.name}.2"), log.with_name(f"{log.name}.1"), log]
    assert sorted(p.name for p in tmp_path.joinpath("logs").iterdir()) == sorted(p.name for p in kept)
    sizes = [p.stat().st_size for p in kept]
    line = len("line 0000000\n")
    assert all(size <= rotation.max_bytes for size in sizes), sizes
    assert all(size > rotation.max_bytes - line for size in sizes[:2]), f"rotated only when full: {sizes}"
    written = "".join(f"line {i:07d}\n" for i in range(LINES))
    tail = "".join(p.read_text() for p in kept)
    assert written.endswith(tail), "what is kept is the output's end, nothing missing in between"
    assert len(tail) == sum(sizes)


def test_the_platform_services_write_through_rotating_writers(platform: GPULensSettings) -> None:
    services = manager(platform)
    for name in (BROKER, REGISTRY, CLICKHOUSE):
        pid = services.status(name).pid
        assert pid is not None
        assert str(Path(f"/proc/{pid}/fd/1").readlink()).startswith("pipe:"), f"{name} writes into a pipe"
        assert _writers_of(services.log_path(name)), f"{name}'s log has its writer"
