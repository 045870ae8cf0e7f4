"""Node-agent overhead: CPU (share of one core) and RSS for 8 GPUs sampled every 5 s.

    python -m bench.agent_overhead [--seconds 60] [--vendor amd|nvidia] [--interval 5]

The GPU libraries are the test fixtures (tests/fake_amdsmi.py, tests/fake_nvml.py: MI300X /
H100 values, the real libraries' call shapes), so the figure is the agent's own cost:
collection, Avro encoding, producing to a private platform's broker, a kubelet
pod-resources call and an RDMA sysfs read per round. Never asserts, only prints.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpulens.platform import private_platform
from producers.agent import AgentMetrics, AgentSettings, build_agent
from producers.agent.amd import AmdCollector
from producers.agent.collecting import BaseCollector
from producers.agent.nvidia import NvidiaCollector
from producers.agent.podresources import PodResourcesCollector
from producers.agent.rdma import RdmaCollector
from schemas.codec import AvroCodec, registry_client
from schemas.topic_admin import create_topics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fake_amdsmi import FakeAmdSmi, mi300x
from fake_kubelet import serving
from fake_nvml import FakeNvml, h100
from fake_sysfs import build_sysfs


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="How long the agent runs.")
    parser.add_argument("--interval", type=float, default=5.0, help="Sample interval, seconds.")
    parser.add_argument("--vendor", choices=("amd", "nvidia"), default="amd")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as platform:
        create_topics(platform.kafka)
        root = Path(tmp) / "agent"
        root.mkdir()
        with serving(root / "kubelet.sock") as kubelet:
            kubelet.pods = {("ml", f"train-{i}"): {"amd.com/gpu": [f"gpu-{i}"]} for i in range(8)}
            settings = AgentSettings(
                node="bench-node",
                sample_interval_s=args.interval,
                spool_dir=root / "spool",
                sysfs_root=build_sysfs(root / "sys"),
                pod_resources_socket=root / "kubelet.sock",
            )
            gpu: BaseCollector = (
                AmdCollector(FakeAmdSmi([mi300x(i) for i in range(8)]))
                if args.vendor == "amd"
                else NvidiaCollector(FakeNvml([h100(i) for i in range(8)]))
            )
            metrics = AgentMetrics()
            agent = build_agent(
                settings,
                cluster="bench",
                kafka=platform.kafka,
                codec=AvroCodec(registry_client(platform.registry.url)),
                collectors=[
                    gpu,
                    RdmaCollector(settings.sysfs_root),
                    PodResourcesCollector(root / "kubelet.sock"),
                ],
                metrics=metrics,
            )
            agent.start()
            agent.tick()  # warm: schema ids registered, broker connected
            stop = threading.Event()
            rss_start, cpu_start, wall_start = _rss_mb(), _cpu_s(), time.monotonic()
            timer = threading.Timer(args.seconds, stop.set)
            timer.start()
            agent.run(stop)
            cpu, wall = _cpu_s() - cpu_start, time.monotonic() - wall_start
            rss_end = _rss_mb()
            agent.close()
            timer.cancel()
    published = metrics.registry.get_sample_value(
        "gpulens_agent_records_published_total", {"topic": "gpulens.gpu.samples.v1"}
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nagent, 8 {args.vendor} GPUs + 2 RDMA ports + 8 pods, every {args.interval:g} s, {wall:.0f} s:")
    per_round = cpu * 1000 / max(wall / args.interval, 1)
    print(f"  CPU               {100 * cpu / wall:.2f} % of one core ({per_round:.1f} ms per round)")
    print(
        f"  RSS               {rss_start:.0f} MB after start, {rss_end:.0f} MB at the end, peak {peak:.0f} MB"
    )
    print(f"  sample batches    {published:.0f} acknowledged")


if __name__ == "__main__":
    main()
