"""py-spy profiles of :mod:`bench.e2e_scale`'s processes, summarised as their hottest functions.

py-spy samples a running process from outside (``--nonblocking``: it never pauses it), so the
pipeline runs its real code under real load. Only active samples count (idle threads, a
consumer waiting on the broker, are left out), so the shares say where CPU goes. py-spy is a
profiling tool, not a dependency: ``pip install py-spy`` into the venv to use it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _function(frame: str) -> str:
    """``name (path/to/pkg/file.py:123)`` -> ``name (pkg/file.py)``: one entry per function."""
    name, found, where = frame.partition(" (")
    if not found:
        return frame
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})"


def summarise(raw: str, top: int = 12) -> str:
    """Self and inclusive shares of the hottest functions in py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_function(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return "  (no active samples)"
    lines = [f"  {total:,} active samples; self time:"]
    lines += [f"    {100 * n / total:5.1f} %  {f}" for f, n in own.most_common(top)]
    # The entry point and the main loop are in nearly every stack: leave them out.
    below = [(f, n) for f, n in inclusive.most_common() if n < 0.9 * total][:top]
    lines.append("  inclusive (the function and what it calls; frames in 90 %+ of stacks left out):")
    lines += [f"    {100 * n / total:5.1f} %  {f}" for f, n in below]
    return "\n".join(lines)


class Profiler:
    """Runs py-spy on processes and keeps their collapsed stacks under ``directory``."""

    def __init__(self, directory: Path, *, rate: int = 25) -> None:
        self._directory = directory
        self._rate = rate
        self._files: dict[str, Path] = {}

    def record(self, name: str, pid: int, seconds: float) -> None:
        """Sample ``pid`` for ``seconds`` (blocks that long)."""
        sampler = self.start(name, pid, seconds)
        if sampler is not None:
            sampler.wait()

    def start(self, name: str, pid: int, seconds: float = 3600) -> subprocess.Popen[bytes] | None:
        """Start sampling ``pid`` for at most ``seconds``; :meth:`stop` ends it sooner (None: no py-spy)."""
        executable = py_spy()
        if executable is None:
            return None
        self._directory.mkdir(parents=True, exist_ok=True)
        path = self._directory / f"{name}.txt"
        self._files[name] = path
        return subprocess.Popen(
            [
                executable, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                "--rate", str(self._rate), "--nonblocking", "--format", "raw", "--output", str(path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self._directory / f"{name}.log").open("wb"),
        )  # fmt: skip

    @staticmethod
    def stop(sampler: subprocess.Popen[bytes] | None) -> None:
        """End a sampling early: py-spy writes what it has on SIGINT."""
        if sampler is not None and sampler.poll() is None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(30)

    def summaries(self) -> dict[str, str]:
        """Each recorded process's hottest functions."""
        return {
            name: summarise(path.read_text())
            if path.exists()
            else f"  (py-spy wrote nothing: see {path}.log)"
            for name, path in self._files.items()
        }
