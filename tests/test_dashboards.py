"""The Grafana dashboard and the alert rules ask only for metrics the exporter serves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpulens.consumers.prometheus.collecting import StateCollector
from gpulens.consumers.prometheus.health import ConsumerHealth
from gpulens.consumers.prometheus.state import LatestState
from gpulens.schemas.kafka.dead_letters import DEAD_LETTERS

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gpulens-cluster-overview.json"
METRIC = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]")


@pytest.fixture(scope="module")
def served() -> set[str]:
    """Every metric name an exporter serves, read from its collectors (none hard-coded here)."""
    registry = CollectorRegistry()
    registry.register(StateCollector(LatestState()))
    ConsumerHealth(registry, consumer="c")
    families = [*registry.collect(), *DEAD_LETTERS.collect()]
    return {f.name for f in families} | {f"{f.name}_total" for f in families if f.type == "counter"}


def _exprs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def test_the_dashboard_uses_only_served_metrics(served: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(_exprs(dashboard))
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert len(exprs) >= len(dashboard["panels"])
    assert used <= served, used - served
    assert {
        "gpu_allocation_rate",
        "cluster_gpu_capacity",
        "gpu_utilization",
        "consumer_pod_gpu_usage",
    } <= used


def test_the_rules_use_only_served_metrics(served: set[str]) -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    used = {
        name for group in rules["groups"] for rule in group["rules"] for name in METRIC.findall(rule["expr"])
    }
    assert used - {"up"} <= served, used - served
