"""p50 and p95 latency of each `gpulens api` endpoint on the demo's data, beside the bare client.

``python -m bench.api_latency [--config FILE] [--requests N]``. With ``--config``, it measures
the API of a platform `gpulens up` already runs (the demo's data replayed); without, it runs
`gpulens up` on a private platform first (free ports, the whole demo: several minutes) and
`gpulens down` after. Each endpoint is asked N times in a row over HTTP (httpx, one
connection, after two warm-up requests); the baseline runs the endpoint's main statement, with
the same values bound, N times through clickhouse-connect directly (an HTTP client of the
ClickHouse endpoint, no API in between): what the API adds is the difference. A paginated
endpoint runs two statements (the count and the page); its baseline is the statement whole.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from gpulens.api import queries
from gpulens.config import GPULensSettings, load_settings
from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.queries import GPU_ALLOCATION_AS_OF
from gpulens.platform import write_private_config


@dataclass(frozen=True)
class Case:
    """One endpoint asked with ``params``; ``statement`` with ``bound`` is its bare-client baseline."""

    path: str
    params: dict[str, Any]
    statement: str
    bound: dict[str, Any] = field(default_factory=dict)


def percentiles(seconds: list[float]) -> tuple[float, float]:
    """p50 and p95 in milliseconds."""
    cuts = statistics.quantiles(seconds, n=20, method="inclusive")
    return statistics.median(seconds) * 1000, cuts[18] * 1000


def timed(call: Callable[[], object], times: int) -> list[float]:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        spent.append(time.perf_counter() - started)
    return spent


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def cases(settings: GPULensSettings) -> list[Case]:
    """The endpoints over the demo's two clusters, at instants and on entities the data has."""
    client = get_client(settings.clickhouse, database=settings.clickhouse.database)
    ali, gen = f"{settings.cluster}-alibaba", f"{settings.cluster}-genai"

    def scalar(statement: str, **bound: Any) -> Any:
        return client.query(statement, parameters=bound).result_rows[0][0]

    busiest = scalar(
        "SELECT window_end FROM cluster_gpu_allocation FINAL WHERE cluster = {c:String} "
        "ORDER BY gpus_allocated_end DESC LIMIT 1",
        c=ali,
    ).replace(tzinfo=UTC)
    node = scalar(
        "SELECT node FROM pod_events WHERE cluster = {c:String} AND holds_gpus GROUP BY node "
        "ORDER BY count() DESC LIMIT 1",
        c=ali,
    )
    gen_node = scalar("SELECT node FROM gpu_samples WHERE cluster = {c:String} LIMIT 1", c=gen)
    workload = scalar("SELECT workload_uid FROM workload_gpu_usage WHERE cluster = {c:String} LIMIT 1", c=gen)
    newest = scalar("SELECT max(event_time) FROM gpu_samples WHERE cluster = {c:String}", c=gen).replace(
        tzinfo=UTC
    ) + timedelta(milliseconds=1)
    client.close()
    end, start, step = newest, newest - timedelta(hours=1), 60
    span = {"start": rfc3339(start), "end": rfc3339(end)}
    at = {"asOf": rfc3339(busiest)}
    return [
        Case("/api/clusters", {}, queries.CLUSTERS, {"at": queries.END_OF_TIME}),
        Case(f"/api/clusters/{ali}/overview", at, GPU_ALLOCATION_AS_OF, {"cluster": ali, "at": busiest}),
        Case(
            f"/api/clusters/{gen}/consumers",
            {},
            queries.CONSUMERS,
            {"cluster": gen, "at": queries.END_OF_TIME},
        ),
        Case(
            f"/api/clusters/{gen}/idleWorkloads",
            {},
            queries.IDLE_WORKLOADS,
            {
                "cluster": gen,
                "at": queries.END_OF_TIME,
                "start": queries.START_OF_TIME,
                "end": queries.END_OF_TIME,
            },
        ),
        Case(
            f"/api/clusters/{gen}/idleByOwner",
            {"groupBy": "namespace"},
            queries.IDLE_BY_OWNER["namespace"],
            {"cluster": gen, "start": queries.START_OF_TIME, "end": queries.END_OF_TIME},
        ),
        Case(
            f"/api/clusters/{gen}/gpuHeatmap",
            {**span, "step": step},
            queries.GPU_HEATMAP,
            {"cluster": gen, "node": None, "start": start, "end": end, "step": step},
        ),
        Case(
            "/api/nodes", {"cluster": ali, **at}, queries.NODES, {"cluster": ali, "at": busiest, "node": None}
        ),
        Case(
            f"/api/nodes/{node}",
            {"cluster": ali, **at},
            queries.NODE_AT,
            {"cluster": ali, "node": node, "at": busiest},
        ),
        Case(
            f"/api/nodes/{gen_node}/gpuDevices",
            {"cluster": gen},
            queries.NODE_GPU_DEVICES,
            {"cluster": gen, "node": gen_node, "at": queries.END_OF_TIME},
        ),
        Case(
            f"/api/nodes/{gen_node}/gpuHealth",
            {"cluster": gen},
            queries.NODE_GPU_HEALTH,
            {"cluster": gen, "node": gen_node, "at": queries.END_OF_TIME},
        ),
        Case(
            f"/api/nodes/{gen_node}/gpuMetrics",
            {"cluster": gen, **span, "step": step},
            queries.GPU_METRICS,
            {"cluster": gen, "node": gen_node, "start": start, "end": end, "step": step},
        ),
        Case(
            f"/api/nodes/{node}/workloads",
            {"cluster": ali, **at},
            queries.NODE_WORKLOADS,
            {"cluster": ali, "node": node, "at": busiest},
        ),
        Case(
            f"/api/nodes/{node}/workloadsHistory",
            {"cluster": ali},
            queries.NODE_WORKLOADS_HISTORY,
            {"cluster": ali, "node": node, "start": queries.START_OF_TIME, "end": queries.END_OF_TIME},
        ),
        Case(
            f"/api/nodes/{node}/gpuAllocation",
            {"cluster": ali},
            queries.NODE_GPU_ALLOCATION,
            {"cluster": ali, "node": node, "start": queries.START_OF_TIME, "end": queries.END_OF_TIME},
        ),
        Case(
            f"/api/nodes/{gen_node}/gpuUtilizationHistory",
            {"cluster": gen, **span, "step": step},
            queries.UTILIZATION_HISTORY,
            {"cluster": gen, "node": gen_node, "start": start, "end": end, "step": step},
        ),
        Case(
            "/api/workloads",
            {"cluster": ali, **at},
            queries.WORKLOADS,
            {"cluster": ali, "at": busiest, "uid": None, "namespace": None, "kind": None, "status": None},
        ),
        Case(
            f"/api/workloads/{workload}",
            {"cluster": gen},
            queries.WORKLOADS,
            {
                "cluster": gen,
                "at": queries.END_OF_TIME,
                "uid": workload,
                "namespace": None,
                "kind": None,
                "status": None,
            },
        ),
        Case(
            f"/api/workloads/{workload}/hierarchy",
            {"cluster": gen},
            queries.WORKLOAD_PODS,
            {"cluster": gen, "at": queries.END_OF_TIME, "uid": workload},
        ),
        Case(
            f"/api/workloads/{workload}/metrics",
            {"cluster": gen},
            queries.WORKLOAD_METRICS,
            {"cluster": gen, "uid": workload, "start": queries.START_OF_TIME, "end": queries.END_OF_TIME},
        ),
        Case(
            f"/api/workloads/{workload}/pods",
            {"cluster": gen},
            queries.WORKLOAD_PODS,
            {"cluster": gen, "at": queries.END_OF_TIME, "uid": workload},
        ),
        Case(
            "/api/alerts",
            {"cluster": gen},
            queries.ALERTS,
            {"cluster": gen, "at": queries.END_OF_TIME, "alert": None, "state": None},
        ),
        Case("/api/pending", {"cluster": ali, **at}, queries.PENDING, {"cluster": ali, "at": busiest}),
        Case(
            "/api/gpu-aggregation/hourly",
            {"cluster": gen, "groupBy": "workload"},
            queries.HOURLY_BY_WORKLOAD,
            {"cluster": gen, "start": queries.START_OF_TIME, "end": queries.END_OF_TIME},
        ),
    ]


def measure(settings: GPULensSettings, requests: int) -> None:
    token = settings.api.token
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
    base = f"http://{settings.api.host}:{settings.api.port}"
    bare = get_client(settings.clickhouse, database=settings.clickhouse.database)
    print(f"{requests} requests per endpoint, API at {base}, bare client to {settings.clickhouse.url}\n")
    print("| endpoint | API p50 ms | API p95 ms | bare client p50 ms | bare client p95 ms |")
    print("|---|---|---|---|---|")
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        for case in cases(settings):

            def ask(case: Case = case) -> None:
                response = http.get(case.path, params=case.params)
                response.raise_for_status()

            def run(case: Case = case) -> None:
                bare.query(case.statement, parameters=case.bound)

            timed(ask, 2)
            timed(run, 2)
            api, baseline = percentiles(timed(ask, requests)), percentiles(timed(run, requests))
            print(f"| `{case.path}` | {api[0]:.1f} | {api[1]:.1f} | {baseline[0]:.1f} | {baseline[1]:.1f} |")
    bare.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="a running platform's config (default: a private `up`)")
    parser.add_argument("--requests", type=int, default=50, help="timed requests per endpoint")
    args = parser.parse_args()
    if args.config is not None:
        measure(load_settings(args.config), args.requests)
        return
    with tempfile.TemporaryDirectory() as directory:
        config = write_private_config(Path(directory))
        gpulens = [sys.executable, "-m", "gpulens", "--config", str(config)]
        try:
            subprocess.run([*gpulens, "up"], check=True, stdout=subprocess.DEVNULL, timeout=1800)
            measure(load_settings(config), args.requests)
        finally:
            subprocess.run([*gpulens, "down"], check=False, stdout=subprocess.DEVNULL, timeout=600)


if __name__ == "__main__":
    main()
