"""`gpulens agent` serves its node's per-GPU gauges on its own /metrics, with the pod holding
each GPU: the agent runs as a process (bench.agent_with_fakes: the real entry point with the
fake amdsmi of eight MI300X) beside a real kubelet pod-resources server, and every check
scrapes /metrics over HTTP and parses it with prometheus-client's own parser. Expected values
come from the fixture's numbers, not from the agent's code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.platform import free_port
from gpulens.producers.agent import AgentSettings
from gpulens.schemas.model.gpu_metrics import GPU_LABELS, POD_LABELS
from gpulens.testing.fake_amdsmi import mi300x
from gpulens.testing.fake_kubelet import serving

ROOT = Path(__file__).resolve().parent.parent
GPUS = [mi300x(i) for i in range(8)]  # what bench.agent_with_fakes gives the agent
GPU_METRICS = ("gpu_utilization", "gpu_socket_power_watts", "gpu_memory_used_bytes")

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Series:
    """The per-GPU series of one scrape, by name and labels (empty while nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in GPU_METRICS
    }


def expected(cluster: str, node: str, holders: dict[int, list[tuple[str, str]]]) -> Series:
    """Every GPU's three gauges from the fixture; ``holders``: GPU index -> (namespace, pod) of
    the containers ("main") holding it, in the kubelet's sorted order."""
    out: Series = {}
    for index, gpu in enumerate(GPUS):
        held = holders.get(index, [])
        labels = {
            "cluster": cluster,
            "node": node,
            "gpu_id": str(index),
            "device_id": gpu["uuid"],
            "namespace": ",".join(namespace for namespace, _ in held),
            "pod": ",".join(pod for _, pod in held),
            "container": ",".join("main" for _ in held),
        }
        key = frozenset(labels.items())
        out[("gpu_utilization", key)] = gpu["activity"]["gfx_activity"]
        out[("gpu_socket_power_watts", key)] = gpu["power"]["current_socket_power"]
        out[("gpu_memory_used_bytes", key)] = gpu["vram_used"]
    return out


def wait_for(url: str, condition: Callable[[Series], bool], what: str, agent, timeout: float = 60) -> Series:
    deadline = time.monotonic() + timeout
    while not condition(series := scrape(url)):
        assert agent.poll() is None, f"the agent exited ({agent.returncode})"
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; last scrape: {sorted(series.items())}")
        time.sleep(0.1)
    return series


def test_the_agent_serves_every_gpu_with_the_pods_holding_it(
    platform, config_file, unique, tmp_path, spawned
):
    node, port = f"node-{unique}", free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = {
        **os.environ,
        "GPULENS_CONFIG": str(config_file),
        "NODE_NAME": node,
        "GPULENS_AGENT__COLLECTORS": json.dumps(["amd", "pod-resources"]),
        "GPULENS_AGENT__SAMPLE_INTERVAL_S": "0.2",
        "GPULENS_AGENT__SPOOL_DIR": str(tmp_path / "spool"),
        "GPULENS_AGENT__POD_RESOURCES_SOCKET": str(tmp_path / "kubelet.sock"),
        "GPULENS_AGENT__METRICS_PORT": str(port),
    }
    with serving(tmp_path / "kubelet.sock") as kubelet:
        # Device plugins name GPUs their own way: by PCI address, UUID or board serial.
        kubelet.pods = {
            ("ml", "train-0"): {"amd.com/gpu": [GPUS[0]["bdf"], GPUS[1]["uuid"]]},
            ("ml", "infer-a"): {"amd.com/gpu": [GPUS[5]["board"]["product_serial"]]},
            ("serve", "infer-b"): {"amd.com/gpu": [GPUS[5]["bdf"]]},  # the same GPU, shared
        }
        agent = subprocess.Popen(
            [sys.executable, "-m", "bench.agent_with_fakes", "amd", "agent"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        spawned.append(agent)
        holders = {
            0: [("ml", "train-0")],
            1: [("ml", "train-0")],
            5: [("ml", "infer-a"), ("serve", "infer-b")],
        }
        want = expected(platform.cluster, node, holders)
        wait_for(url, lambda s: s == want, "every GPU with its holders", agent)

        # train-0 ends and a new pod takes GPU 7: the next rounds say so
        kubelet.pods = {
            ("ml", "infer-a"): {"amd.com/gpu": [GPUS[5]["bdf"]]},
            ("ml", "train-1"): {"amd.com/gpu": [GPUS[7]["uuid"]]},
        }
        want = expected(platform.cluster, node, {5: [("ml", "infer-a")], 7: [("ml", "train-1")]})
        series = wait_for(url, lambda s: s == want, "the holders after the pods changed", agent)
        assert {name for name, _ in series} == set(GPU_METRICS)
        assert all({k for k, _ in labels} == {*GPU_LABELS, *POD_LABELS} for _, labels in series)

        agent.send_signal(signal.SIGTERM)
        _, errors = agent.communicate(timeout=60)
    assert agent.returncode == 0, errors.decode()


def test_the_agents_metrics_bind_loopback_unless_configured():
    assert AgentSettings().metrics_host == "127.0.0.1"
