"""`gpulens agent` as deployed, with the GPU library of a node swapped for its test fake.

    python -m bench.agent_with_fakes amd|nvidia [gpulens arguments ...]

The only difference from the deployed command: ``import amdsmi`` (or ``import pynvml``'s
device calls) answers from gpulens/testing/fake_amdsmi.py (gpulens/testing/fake_nvml.py) with 8 MI300X (H100).
Everything else (settings from GPULENS_CONFIG and GPULENS_* variables, the CLI, the imports,
the metrics endpoint, SIGTERM handling) is the real ``gpulens`` entry point, so its footprint
is the agent's. bench.agent_overhead starts it; it is no use on its own.
"""

from __future__ import annotations

import sys

GPUS = 8


def main() -> None:
    vendor, *argv = sys.argv[1:]
    if vendor == "amd":
        from gpulens.testing.fake_amdsmi import FakeAmdSmi, mi300x

        sys.modules["amdsmi"] = FakeAmdSmi([mi300x(i) for i in range(GPUS)])  # type: ignore[assignment]
    else:
        from gpulens.testing.fake_nvml import FakeNvml, h100

        sys.modules["pynvml"] = FakeNvml([h100(i) for i in range(GPUS)])  # type: ignore[assignment]
    sys.argv = ["gpulens", *argv]
    from gpulens.cli import main as gpulens

    gpulens()


if __name__ == "__main__":
    main()
