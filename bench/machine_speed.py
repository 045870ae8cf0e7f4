"""How fast this machine runs Python right now: one fixed loop's CPU seconds.

    python -m bench.machine_speed

The end-to-end figures are CPU-bound on 2 cores, and the machines this bench runs on differ: on
2026-12-02 ``python -m bench.sample_decode`` read a batch by column in 28.4 µs where the README's
figure, from an earlier machine, is 10.8, and code that held 100,000 GPUs at p99 2.6 s on the
earlier machine that morning fell behind. A fixed loop of pure Python in a fresh interpreter (best of three,
CPU seconds, so other work on the machine counts only as far as it slows the core itself) tells
which kind of machine a figure came from. ``bench.e2e_scale`` prints it before each size.
"""

from __future__ import annotations

import math
import subprocess
import sys

PROGRAM = """
import time
started = time.process_time()
total = 0
for i in range(20_000_000):
    total += i
print(time.process_time() - started)
"""
"""20 million additions in a loop: the interpreter's dispatch, as most of the pipeline's Python."""


def loop_cpu_s(repeat: int = 3) -> float:
    """CPU seconds :data:`PROGRAM`'s loop took, best of ``repeat`` fresh interpreters."""
    best = math.inf
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True)
        best = min(best, float(out.stdout))
    return best


def main() -> None:
    print(f"a loop of 20 million additions: {loop_cpu_s():.2f} CPU-s (best of 3)")


if __name__ == "__main__":
    main()
