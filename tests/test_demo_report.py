"""`gpulens up` prints its report once the pipeline has drained: the final numbers, every run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpulens.config import load_settings
from gpulens.consumers.clickhouse.client import get_client
from gpulens.draining import wait_drained
from gpulens.main_job import print_report
from gpulens.platform import write_private_config
from gpulens.producers.replay.locating import traces_dir

GENAI_SAMPLES = traces_dir() / "alibaba-genai-2026" / "pod_gpu_duty_cycle_48pods.csv"


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def test_the_report_shows_what_clickhouse_holds_once_everything_is_processed(tmp_path: Path) -> None:
    """The report `up` prints equals the same report computed afterwards, once every consumer
    group is (still) drained: nothing the replay published arrived after it was printed."""
    config = write_private_config(tmp_path)
    try:
        up = subprocess.run(gpulens(config, "up"), capture_output=True, text=True, timeout=1200)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "every consumer group has consumed every record" in up.stdout
        printed = up.stdout[up.stdout.index("\nGPU allocation over time") : up.stdout.index("\nready:")]
        settings = load_settings(config)
        assert wait_drained(settings, timeout_s=60) is not None, "still drained after the report"
        lines: list[str] = []
        print_report(settings, lines.append)
        assert printed.strip() == "\n".join(lines).strip()
        assert "GpuPodPending" in printed and "GpuIdle" in printed, printed
        # Nothing lost on the way (retention runs beside the pipeline): every row of the GenAI
        # trace is one sample of a GPU its workload's pod held.
        with GENAI_SAMPLES.open() as handle:
            rows = sum(1 for _ in handle) - 1  # the header
        client = get_client(settings.clickhouse, database=settings.clickhouse.database)
        counted = client.query(
            "SELECT sum(samples) FROM workload_gpu_usage FINAL WHERE cluster = {c:String}",
            parameters={"c": f"{settings.cluster}-genai"},
        ).result_rows[0][0]
        assert counted == rows
    finally:
        subprocess.run(gpulens(config, "down"), capture_output=True, timeout=600, check=False)
