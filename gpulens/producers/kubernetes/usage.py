"""Volume usage from every node's kubelet summary, read through the API server's node proxy.

``GET /api/v1/nodes/{node}/proxy/stats/summary`` is what ``kubectl top`` and metrics-server's
predecessors read; its ``pods[].volume[]`` entries with a ``pvcRef`` carry the statfs of each
mounted claim. One round reads every node once; a node whose kubelet does not answer (NotReady,
a firewall) is skipped for the round, so one bad node costs its usage, not the scan.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from gpulens.producers.kubernetes.api import KubeApi
from gpulens.producers.kubernetes.exceptions import KubernetesApiError
from gpulens.producers.kubernetes.resources import NODES
from gpulens.producers.kubernetes.volumes import VolumeUsage, summary_usage

log = logging.getLogger(__name__)

KEY = "kubelet-summary"
"""The key a round's item is known by among the resources a session waits for."""


@dataclass(frozen=True, slots=True)
class Measured:
    """One round of usage reports, from every node that answered."""

    reports: list[VolumeUsage]


def measure(api: KubeApi) -> Measured:
    """Read every node's summary once."""
    try:
        nodes = [n["metadata"]["name"] for n in api.request("GET", NODES.path()).get("items") or ()]
    except KubernetesApiError as err:
        log.warning("volume usage: cannot list nodes: %s", err)
        return Measured([])
    reports: list[VolumeUsage] = []
    for node in nodes:
        try:
            summary = api.request("GET", f"/api/v1/nodes/{quote(node, safe='')}/proxy/stats/summary")
        except KubernetesApiError as err:
            log.warning("volume usage of node %s skipped this round: %s", node, err)
            continue
        reports.extend(summary_usage(summary))
    return Measured(reports)


def poll(api: KubeApi, interval_s: float, put: Callable[[Measured], None], stop: threading.Event) -> None:
    """:func:`measure` now and every ``interval_s`` until ``stop``, each round handed to ``put``."""
    while not stop.is_set():
        put(measure(api))
        if stop.wait(interval_s):
            return
