"""Node-agent overhead: CPU (share of one core) and RSS for 8 GPUs sampled every 5 s.

    python -m bench.agent_overhead [--seconds 60] [--vendor amd|nvidia] [--interval 5]

Measures the process as deployed: ``gpulens agent`` in a process of its own (started through
bench.agent_with_fakes, which swaps only the GPU library for gpulens/testing/fake_amdsmi.py or
gpulens/testing/fake_nvml.py: MI300X / H100 values, the real libraries' call shapes), configured as
deploy/k8s/agent.yaml configures it (GPULENS_CONFIG plus GPULENS_AGENT__* variables, its
metrics endpoint on). It publishes to a private platform's broker and registry, lists pod
resources from a fake kubelet and reads a fake sysfs tree with two RDMA ports; those run in
this process, so the agent's figures are its own: CPU from /proc/PID/stat, RSS from
/proc/PID/status, records acknowledged from its /metrics. Never asserts, only prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.e2e_probes import usage
from gpulens.platform import free_port, private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.testing.fake_kubelet import serving
from gpulens.testing.fake_sysfs import build_sysfs


def _status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem of ``pid`` in MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            values[name] = int(rest.split()[0]) / 1024
    return values


def _cpu_s(pid: int) -> float:
    measured = usage([pid])
    if measured is None:
        raise SystemExit(f"the agent (pid {pid}) is gone")
    return measured.cpu_s


def _published(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(
        r'^gpulens_agent_records_published_total\{topic="gpulens\.gpu\.samples\.v1"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def _wait_published(
    metrics_url: str, at_least: float, agent: subprocess.Popen[str], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise SystemExit(f"the agent exited with {agent.returncode}")
        try:
            if _published(metrics_url) >= at_least:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"no sample batch acknowledged within {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="How long the agent is measured.")
    parser.add_argument("--interval", type=float, default=5.0, help="Sample interval, seconds.")
    parser.add_argument("--vendor", choices=("amd", "nvidia"), default="amd")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as platform:
        create_topics(platform.kafka)
        root = Path(tmp) / "agent"
        root.mkdir()
        resource = "amd.com/gpu" if args.vendor == "amd" else "nvidia.com/gpu"
        metrics_port = free_port()
        env = {
            **os.environ,
            "GPULENS_CONFIG": str(Path(tmp) / "gpulens.toml"),
            "NODE_NAME": "bench-node",
            "GPULENS_AGENT__COLLECTORS": json.dumps([args.vendor, "rdma", "pod-resources"]),
            "GPULENS_AGENT__SAMPLE_INTERVAL_S": str(args.interval),
            "GPULENS_AGENT__SPOOL_DIR": str(root / "spool"),
            "GPULENS_AGENT__SYSFS_ROOT": str(build_sysfs(root / "sys")),
            "GPULENS_AGENT__POD_RESOURCES_SOCKET": str(root / "kubelet.sock"),
            "GPULENS_AGENT__METRICS_PORT": str(metrics_port),
        }
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        with serving(root / "kubelet.sock") as kubelet:
            kubelet.pods = {("ml", f"train-{i}"): {resource: [f"gpu-{i}"]} for i in range(8)}
            agent = subprocess.Popen(
                [sys.executable, "-m", "bench.agent_with_fakes", args.vendor, "agent"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                _wait_published(metrics_url, 1, agent)  # warm: schema ids registered, broker connected
                start = _status(agent.pid)
                cpu_start, wall_start, first = _cpu_s(agent.pid), time.monotonic(), _published(metrics_url)
                deadline = wall_start + args.seconds
                peak_during = start["VmRSS"]
                while (left := deadline - time.monotonic()) > 0:
                    time.sleep(min(left, 1.0))
                    peak_during = max(peak_during, _status(agent.pid)["VmRSS"])
                cpu, wall = _cpu_s(agent.pid) - cpu_start, time.monotonic() - wall_start
                end = _status(agent.pid)
                published = _published(metrics_url) - first
            finally:
                agent.send_signal(signal.SIGTERM)
                _, errors = agent.communicate(timeout=60)
    if agent.returncode:
        print(errors, file=sys.stderr)
    print(
        f"\n`gpulens agent`, 8 {args.vendor} GPUs + 2 RDMA ports + 8 pods, every {args.interval:g} s, "
        f"{wall:.0f} s:"
    )
    per_round = cpu * 1000 / max(wall / args.interval, 1)
    print(f"  CPU               {100 * cpu / wall:.2f} % of one core ({per_round:.1f} ms per round)")
    print(
        f"  RSS               {start['VmRSS']:.0f} MB after the first round, {end['VmRSS']:.0f} MB at "
        f"the end, peak {max(end['VmHWM'], peak_during):.0f} MB"
    )
    print(
        f"  RSS at the end    {end['RssAnon']:.0f} MB anonymous (heaps, stacks), "
        f"{end['RssFile']:.0f} MB file-backed (code of Python and the native libraries)"
    )
    print(f"  sample batches    {published:.0f} acknowledged while measured")
    print(f"  exit on SIGTERM   {agent.returncode}")


if __name__ == "__main__":
    main()
