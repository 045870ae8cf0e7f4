"""The storage scan end to end: fake API server (PVs, claims, classes, kubelet summaries) -> watcher
-> real broker -> StorageEvents; and those events -> sink -> real ClickHouse -> the API.

The fixtures (tests/fixtures/storage/, see its README) are `kubectl get ... -o json` and kubelet
``/stats/summary`` output: a cluster written by hand to their shapes, and captures from real
clusters (``captured-*``: a csi-driver-nfs class, claim and volume; a kubelet's measurement of a
claim). What each volume should become is computed here from the fixture JSON by rules written
out independently (a claim's status.capacity, else the volume's; the newest measurement of a
claim over the nodes), with the kind and driver of each volume written by hand from reading the
fixtures.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kubernetes.client import Configuration
from sink_support import SinkThread
from watcher_support import Published, RunningWatcher, make_watcher, wait_for, watcher_settings

from gpulens.api.app import build_app
from gpulens.api.reading import Reader
from gpulens.api.settings import ApiSettings
from gpulens.config import GPULensSettings
from gpulens.producers.kubernetes import KubeApi, Watcher
from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.producers.kubernetes.usage import measure
from gpulens.producers.kubernetes.volumes import StorageContext, VolumeTranslator, VolumeUsage
from gpulens.schemas.model.models import ChangeType, StorageEvent
from gpulens.schemas.model.topics import STORAGE
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.fake_kube import FakeKube

FIXTURES = Path(__file__).parent / "fixtures" / "storage"
T0 = datetime(2025, 3, 14, tzinfo=UTC)
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}

JUICEFS = "pvc-3f1c2a9e-6a5b-4d1e-9c1f-1a2b3c4d5e6f"
NFS_SUBDIR = "pvc-8d0e1b55-0f3a-4f0e-b1de-2c3d4e5f6a7b"
NFS_CSI = "pvc-c41e7d20-93b8-4b2a-a0f6-7e8f9a0b1c2d"
FSX = "pvc-5a6b7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d"
LOCAL = "local-pv-gpu-node-1-nvme0"
EBS = "pvc-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a5b"
HOSTPATH = "models-hostpath"
CAPTURED_NFS = "pvc-2eee4110-3dc8-4ed3-b3c5-40581ec9319d"
"""The volume csi-driver-nfs provisioned in a real cluster (captured-nfs-csi-*.json)."""
CAPTURED = (
    ("storageclasses", "captured-nfs-csi-storageclasses.json"),
    ("persistentvolumeclaims", "captured-nfs-csi-persistentvolumeclaims.json"),
    ("persistentvolumes", "captured-nfs-csi-persistentvolumes.json"),
)

KIND_AND_DRIVER = {
    JUICEFS: ("juicefs", "csi.juicefs.com"),
    NFS_SUBDIR: ("nfs", "k8s-sigs.io/nfs-subdir-external-provisioner"),  # in-tree nfs; the class's
    NFS_CSI: ("nfs", "nfs.csi.k8s.io"),
    FSX: ("lustre", "fsx.csi.aws.com"),
    LOCAL: ("local", "kubernetes.io/no-provisioner"),
    EBS: ("csi", "ebs.csi.aws.com"),
    HOSTPATH: ("hostpath", None),
    CAPTURED_NFS: ("nfs", "nfs.csi.k8s.io"),
}
"""Read off the fixtures: the kind each volume is and the driver or provisioner that serves it."""
NODE_AND_MOUNT = {
    NFS_SUBDIR: (None, "10.20.0.15:/srv/nfs/ml-datasets-pvc-8d0e1b55-0f3a-4f0e-b1de-2c3d4e5f6a7b"),
    LOCAL: ("gpu-node-1", "/mnt/disks/nvme0"),
    HOSTPATH: (None, "/data/models"),
}


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def size(quantity: str) -> int:
    """A binary-suffixed quantity of the fixtures (``2400Gi``) in bytes."""
    return int(quantity[:-2]) * UNITS[quantity[-2:]]


def expected_volumes(
    volumes: list[dict], claims: list[dict], summaries: list[dict]
) -> dict[str, tuple[Any, ...]]:
    """Each volume's (kind, driver, class, namespace, claim, node, mount, capacity, used, available)."""
    by_claim = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
    newest: dict[tuple[str, str], dict] = {}
    for summary in summaries:
        for pod in summary["pods"]:
            for volume in pod["volume"]:
                if "pvcRef" in volume:
                    key = (volume["pvcRef"]["namespace"], volume["pvcRef"]["name"])
                    if key not in newest or volume["time"] > newest[key]["time"]:
                        newest[key] = volume
    expected = {}
    for pv in volumes:
        name, spec = pv["metadata"]["name"], pv["spec"]
        ref = spec.get("claimRef")
        key = (ref["namespace"], ref["name"]) if ref else None
        claim = by_claim.get(key) if key else None
        capacity = size(claim["status"]["capacity"]["storage"] if claim else spec["capacity"]["storage"])
        measured = newest.get(key) if key else None
        expected[name] = (
            *KIND_AND_DRIVER[name],
            spec.get("storageClassName"),
            key[0] if key else None,
            key[1] if key else None,
            *NODE_AND_MOUNT.get(name, (None, None)),
            capacity,
            measured["usedBytes"] if measured else None,
            measured["availableBytes"] if measured else None,
        )
    return expected


def observed(event: StorageEvent) -> tuple[Any, ...]:
    return (
        *(event.storage_kind, event.driver, event.storage_class, event.namespace, event.claim, event.node),
        *(event.mount_point, event.capacity_bytes, event.used_bytes, event.available_bytes),
    )


def seed(kube: FakeKube) -> None:
    """The fixtures' cluster: three nodes, the third one's kubelet unreachable."""
    for plural, name in (
        ("storageclasses", "storageclasses.json"),
        ("persistentvolumeclaims", "persistentvolumeclaims.json"),
        ("persistentvolumes", "persistentvolumes.json"),
    ):
        for obj in load(name)["items"]:
            kube.create(plural, obj)
    for node in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
        kube.create("nodes", {"metadata": {"name": node}, "status": {}})
    for node in ("gpu-node-1", "gpu-node-2"):
        kube.set_summary(node, load(f"summary-{node}.json"))


def storage_settings() -> WatcherSettings:
    return watcher_settings().model_copy(update={"storage_usage_interval_s": 0.2})


def storage_watcher(
    platform: GPULensSettings, codec: AvroCodec, kube: FakeKube, cluster: str
) -> tuple[Watcher, KubeApi]:
    watcher, api, _ = make_watcher(platform, codec, kube, cluster, storage_settings())
    return watcher, api


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as fake:
        seed(fake)
        yield fake


@pytest.fixture
def start_storage_watcher(start_watcher: Callable[..., RunningWatcher]) -> Callable[[], RunningWatcher]:
    return lambda: start_watcher(settings=storage_settings())


def storage_events(published: Published) -> list[StorageEvent]:
    return [e for e in published.drain() if isinstance(e, StorageEvent)]


def set_usage(summary: dict, claim: str, *, used: int, time: str) -> dict:
    """``summary`` with ``claim``'s volume measured anew."""
    changed = copy.deepcopy(summary)
    for pod in changed["pods"]:
        for volume in pod["volume"]:
            if volume.get("pvcRef", {}).get("name") == claim:
                volume.update(usedBytes=used, availableBytes=volume["capacityBytes"] - used, time=time)
    return changed


def test_volumes_are_published_with_kind_capacity_and_usage_and_follow_changes(
    kube, start_storage_watcher, published
) -> None:
    volumes, claims = load("persistentvolumes.json")["items"], load("persistentvolumeclaims.json")["items"]
    summaries = [load("summary-gpu-node-1.json"), load("summary-gpu-node-2.json")]
    expected = expected_volumes(volumes, claims, summaries)
    first = start_storage_watcher()
    published.wait(*[("StorageEvent", name, ChangeType.ADDED) for name in expected])
    events = storage_events(published)
    assert {e.name: observed(e) for e in events} == expected  # whole at once: usage before volumes
    assert len(events) == len(expected)
    assert kube.count("GET", "nodes/proxy") >= 3  # gpu-node-3 answered 503 and was skipped

    # The JuiceFS claim measured anew on node 2; the Lustre claim's expansion done; a volume gone.
    summaries[1] = set_usage(summaries[1], "checkpoints", used=40 * UNITS["Ti"], time="2025-03-14T10:01:01Z")
    kube.set_summary("gpu-node-2", summaries[1])
    kube.update(
        "persistentvolumeclaims",
        "scratch",
        lambda c: c["status"].update(capacity={"storage": "2400Gi"}),
        namespace="ml",
    )
    claims = [
        kube.get("persistentvolumeclaims", c["metadata"]["name"], namespace=c["metadata"]["namespace"])
        for c in claims
    ]
    kube.delete("persistentvolumes", HOSTPATH, namespace="")
    published.wait(
        ("StorageEvent", JUICEFS, ChangeType.MODIFIED),
        ("StorageEvent", FSX, ChangeType.MODIFIED),
        ("StorageEvent", HOSTPATH, ChangeType.DELETED),
    )
    first.halt()
    changes = storage_events(published)[len(expected) :]
    after = expected_volumes(volumes, claims, summaries)
    assert sorted((e.name, e.type) for e in changes) == sorted(
        [(JUICEFS, ChangeType.MODIFIED), (FSX, ChangeType.MODIFIED), (HOSTPATH, ChangeType.DELETED)]
    )
    assert {e.name: observed(e) for e in changes} == {n: after[n] for n in (JUICEFS, FSX, HOSTPATH)}
    assert after[JUICEFS][-2:] == (40 * UNITS["Ti"], 1024 * UNITS["Ti"] - 40 * UNITS["Ti"])
    assert after[FSX][7] == 2400 * UNITS["Gi"]

    # A restart publishes nothing again (the usage published is the usage known at start) but the
    # volume deleted while no watcher ran.
    kube.delete("persistentvolumes", EBS, namespace="")
    start_storage_watcher()
    list_before = kube.count("GET", "persistentvolumes")
    wait_for(
        lambda: kube.count("GET", "persistentvolumes") > list_before, what="the restarted watcher's list"
    )
    sentinel = copy.deepcopy(next(v for v in volumes if v["metadata"]["name"] == HOSTPATH))
    sentinel["metadata"].update(name="after-restart", uid="0f0f0f0f-0000-4000-8000-000000000000")
    kube.create("persistentvolumes", sentinel)  # after the list, in the same stream: its event comes last
    published.wait(("StorageEvent", "after-restart", ChangeType.ADDED))
    restarted = storage_events(published)[len(expected) + 3 :]
    assert [(e.name, e.type) for e in restarted] == [
        (EBS, ChangeType.DELETED),
        ("after-restart", ChangeType.ADDED),
    ]
    assert observed(restarted[0]) == after[EBS]  # its last state
    assert len({e.event_id for e in storage_events(published)}) == len(storage_events(published))


def test_volumes_land_in_clickhouse_and_the_api_lists_them(platform, codec, kube, cluster, published, unique):
    watcher, api = storage_watcher(platform, codec, kube, cluster)
    watcher.run_once()  # `gpulens watch --once`: classes, claims, one usage round, then volumes
    api.close()
    events = storage_events(published)
    volumes, claims = load("persistentvolumes.json")["items"], load("persistentvolumeclaims.json")["items"]
    expected = expected_volumes(
        volumes, claims, [load("summary-gpu-node-1.json"), load("summary-gpu-node-2.json")]
    )
    assert {e.name: observed(e) for e in events} == expected

    sink = SinkThread(platform, codec, unique).start()
    try:
        sink.publish(STORAGE, events)
        sink.wait_rows("storage_volumes", len(expected), f"cluster = '{cluster}'")
        client = TestClient(build_app(ApiSettings(), Reader(sink.client())))
        answer = client.get(f"/api/clusters/{cluster}/storage")
        assert answer.status_code == 200, answer.text
        rows = {r["name"]: r for r in answer.json()["data"]}
        assert answer.json()["total"] == len(expected)
        keys = ("storage_kind", "driver", "storage_class", "namespace", "claim", "node", "mount_point")
        keys += ("capacity_bytes", "used_bytes", "available_bytes")
        assert {n: tuple(r[k] for k in keys) for n, r in rows.items()} == expected
        for name, row in rows.items():
            used, available = expected[name][-2:]
            assert row["used_pct"] == (
                None if used is None else pytest.approx(100 * used / (used + available))
            )
        nfs = client.get(f"/api/clusters/{cluster}/storage", params={"kind": "nfs"}).json()["data"]
        assert sorted(r["name"] for r in nfs) == sorted(n for n, v in expected.items() if v[0] == "nfs")
        by_kind = (
            sink.client()
            .query(
                "SELECT storage_kind, count(), sum(capacity_bytes) FROM storage_volumes FINAL "
                "WHERE cluster = {c:String} GROUP BY storage_kind ORDER BY storage_kind",
                parameters={"c": cluster},
            )
            .result_rows
        )
        full = (
            sink.client()
            .query(  # the README's "claims over 90 % full", at 30 %
                "SELECT namespace, claim, storage_kind, used_bytes * 100 / (used_bytes + available_bytes) "
                "AS used_pct FROM storage_volumes FINAL WHERE cluster = {c:String} AND type != 'DELETED' "
                "AND used_pct > 30 ORDER BY claim",
                parameters={"c": cluster},
            )
            .result_rows
        )
        assert [(ns, claim) for ns, claim, _, _ in full] == sorted(
            ((v[3], v[4]) for v in expected.values() if v[8] is not None and v[8] * 100 / (v[8] + v[9]) > 30),
            key=lambda k: k[1],
        )
        kinds = sorted({v[0] for v in expected.values()})
        assert by_kind == [
            (k, sum(v[0] == k for v in expected.values()), sum(v[7] for v in expected.values() if v[0] == k))
            for k in kinds
        ]
    finally:
        sink.stop()


def test_a_driver_not_listed_is_known_by_its_name_and_the_settings_can_name_more() -> None:
    kinds = WatcherSettings(storage_kinds={"csi.weka.io": "weka"}).storage_kinds
    translator = VolumeTranslator("c1", "k8s-watcher", kinds)

    def kind(driver: str) -> str:
        volume = {"metadata": {"name": "v", "uid": "u"}, "spec": {"csi": {"driver": driver}}}
        return translator.volume(volume, StorageContext(), change=ChangeType.ADDED, at=T0).storage_kind

    assert [kind(d) for d in ("csi.weka.io", "juicefs.csi.example.com", "lustre.csi.ddn.com")] == [
        "weka",
        "juicefs",
        "lustre",
    ]
    assert kind("fsx.csi.aws.com") == "csi"  # the settings replace the default table
    assert kind("disk.csi.azure.com") == "csi"


def test_a_volume_captured_from_a_real_cluster_is_published_with_its_claims_capacity(
    platform, codec, cluster, published
) -> None:
    """A real `kubectl get storageclass,pvc,pv -o yaml` of csi-driver-nfs's dynamic provisioning
    (20Gi claim jlab/jupyterhub-shared-volume of class nfs-csi), served by the fake API server and
    scanned once: one volume, of kind nfs, its claim, class and capacity as the capture says."""
    with FakeKube() as kube:
        for plural, name in CAPTURED:
            for obj in load(name)["items"]:
                kube.create(plural, obj)
        watcher, api = storage_watcher(platform, codec, kube, cluster)
        watcher.run_once()
        api.close()
    (volume,) = load("captured-nfs-csi-persistentvolumes.json")["items"]
    (claim,) = load("captured-nfs-csi-persistentvolumeclaims.json")["items"]
    (storage_class,) = load("captured-nfs-csi-storageclasses.json")["items"]
    assert volume["spec"]["csi"]["driver"] == storage_class["provisioner"] == KIND_AND_DRIVER[CAPTURED_NFS][1]
    expected = expected_volumes([volume], [claim], [])
    assert expected[CAPTURED_NFS][2:5] == ("nfs-csi", "jlab", "jupyterhub-shared-volume")
    assert expected[CAPTURED_NFS][7] == size(claim["status"]["capacity"]["storage"]) == 20 * UNITS["Gi"]
    events = storage_events(published)
    assert {e.name: observed(e) for e in events} == expected
    assert [e.type for e in events] == [ChangeType.ADDED]


def test_a_claims_usage_captured_from_a_real_kubelet_is_read_through_the_node_proxy() -> None:
    """A real kubelet's ``/stats/summary`` entry for a claim's volume (an AKS node, Azure Disk):
    the pod's ``volume`` list as captured, served as that node's summary by the fake API server."""
    captured = load("captured-summary-volume-aks.json")
    (volume,) = captured["volume"]
    with FakeKube() as kube:
        kube.create("nodes", {"metadata": {"name": "aks-node"}, "status": {}})
        kube.set_summary("aks-node", {"pods": [captured]})
        api = KubeApi(Configuration(host=kube.url), request_timeout_s=5)
        try:
            measured = measure(api)
        finally:
            api.close()
    ref = volume["pvcRef"]
    assert measured.reports == [
        VolumeUsage(
            claim=(ref["namespace"], ref["name"]),
            time=datetime(2022, 11, 28, 9, 0, 35, tzinfo=UTC),
            used_bytes=volume["usedBytes"],
            available_bytes=volume["availableBytes"],
        )
    ]
    assert (volume["usedBytes"], volume["availableBytes"]) == (100524032, 107171033088)
