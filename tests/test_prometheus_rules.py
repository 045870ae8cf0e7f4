"""The alert rules of deploy/prometheus pass `promtool check rules` and their unit tests.

promtool comes from Debian's prometheus package, unpacked into .tools/ by
deploy/prometheus/install_promtool.sh (no server is installed or started): the ``promtool``
fixture of conftest.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus"


def _assert_promtool_succeeds(promtool: Path, cwd: Path, *args: str) -> None:
    result = subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("command", "file"), [("check", "rules.yml"), ("test", "rules_test.yml")], ids=["check", "test"]
)
def test_promtool_rules(promtool: Path, command: str, file: str) -> None:
    _assert_promtool_succeeds(promtool, RULES, command, "rules", file)


def test_promtool_checks_the_scrape_config(promtool: Path, tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes discovery: each job's discovery is swapped
    for an empty target list, so that it checks everything else (relabelling, rule files)."""
    config = yaml.safe_load((RULES / "prometheus.yml").read_text())
    config["rule_files"] = [str(RULES / name) for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod", "namespaces": {"names": ["gpulens"]}}]
        job["static_configs"] = [{"targets": []}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    _assert_promtool_succeeds(promtool, tmp_path, "check", "config", "prometheus.yml")


def test_the_agents_job_keeps_every_agent_pods_metrics_port_with_its_own_labels() -> None:
    """The per-GPU gauges come from the agents: their job must match the DaemonSets' pod labels
    and port name, and keep the gauges' namespace/pod/container labels (the GPU's holder)."""
    config = yaml.safe_load((RULES / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "gpulens-agents")
    assert job["honor_labels"] is True
    keep = next(r for r in job["relabel_configs"] if r["action"] == "keep")
    daemonsets = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "agent.yaml").read_text())
        if d["kind"] == "DaemonSet"
    ]
    assert len(daemonsets) == 2
    for daemonset in daemonsets:
        labels = daemonset["spec"]["template"]["metadata"]["labels"]
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        for port in container["ports"]:
            values = [labels["app.kubernetes.io/name"], labels["app.kubernetes.io/component"], port["name"]]
            assert re.fullmatch(keep["regex"], ";".join(values)), daemonset["metadata"]["name"]
