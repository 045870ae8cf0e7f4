"""Idle reclaim end to end: usage on the real broker -> `gpulens reclaim` -> fake API server over HTTP.

The GPU utilization of every workload comes from the GenAI duty-cycle trace (one container's
real series, cut into segments that the test labels idle or busy straight from the CSV); it is
published as workload_gpu_usage windows ending now, one check per window. Each test has its
own cluster name, so it reads back only its own audit records. What the fake API server was
asked to change (``kube.writes``) is the proof of what reclaim did; the fake grants exactly
what the ClusterRole in deploy/k8s/reclaim-rbac.yaml grants, and forbids the rest.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.cli import cli
from gpulens.producers.reclaim.exceptions import PolicyError
from gpulens.producers.reclaim.policy import load_policy
from gpulens.schemas.model.models import ReclaimDecision, ReclaimVerdict, WorkloadGpuUsage
from gpulens.schemas.model.topics import RECLAIM_AUDIT, WORKLOAD_USAGE, record_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.fake_kube import FakeKube, Write

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "alibaba-genai-2026" / "pod_gpu_duty_cycle_48pods.csv"
RBAC = ROOT / "deploy" / "k8s" / "reclaim-rbac.yaml"
SANDBOX = "ml-sandbox"
OPT_IN = {"gpulens.io/reclaim": "enabled"}
CHECKS, WINDOW_S, BELOW = 5, 10, 5.0


# --- real utilization, labelled from the CSV -------------------------------------------------


def _series() -> list[float]:
    """The duty cycle (%) of the trace's first container, in time order."""
    by_container: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with TRACE.open() as f:
        for row in csv.DictReader(f):
            by_container[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    first = next(iter(by_container.values()))
    return [value for _, value in sorted(first)]


def _segment(series: list[float], wanted: Any) -> list[float]:
    return next(series[i : i + CHECKS] for i in range(len(series) - CHECKS) if wanted(series[i : i + CHECKS]))


SERIES = _series()
IDLE = _segment(SERIES, lambda s: max(s) < BELOW and max(s) > 0)
"""Under the threshold at every check (and not all zeros)."""
BUSY = _segment(SERIES, lambda s: s[0] >= BELOW and max(s[1:]) < BELOW)
"""Idle at the 4 newest checks, busy at the oldest: one check short of idle."""
DARK: list[float | None] = [None] * CHECKS
"""GPUs held but never sampled."""


def _grants() -> frozenset[tuple[str, str, str]]:
    """(API group, resource, verb) the reclaim ClusterRole grants."""
    (role,) = [d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "ClusterRole"]
    return frozenset(
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    )


GRANTS = _grants()


# --- the cluster -------------------------------------------------------------------------------


def workload(name: str, *, labels: dict[str, str] | None = None, namespace: str = SANDBOX) -> dict[str, Any]:
    pods = {"app": name}
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": pods},
            "template": {"metadata": {"labels": pods}, "spec": {"containers": [{"name": "main"}]}},
        },
    }


def job(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": SANDBOX, "labels": labels or {}},
        "spec": {
            "template": {"metadata": {"labels": {"job-name": name, "team": "ml"}}, "spec": {"containers": []}}
        },
    }


def service(name: str, selector: dict[str, str], *, namespace: str = SANDBOX) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}


# (plural, object, its utilization); opted in = in SANDBOX with the OPT_IN labels
WORKLOADS = [
    ("deployments", workload("idle-serve", labels=OPT_IN), IDLE),
    ("deployments", workload("busy-serve", labels=OPT_IN), BUSY),
    ("deployments", workload("dark-serve", labels=OPT_IN), DARK),
    ("deployments", workload("idle-other"), IDLE),  # not labelled
    ("deployments", workload("idle-elsewhere", labels=OPT_IN, namespace="team-b"), IDLE),  # not in SANDBOX
    ("statefulsets", workload("idle-db", labels=OPT_IN), IDLE),
    ("jobs", job("idle-train", labels=OPT_IN), IDLE),
    ("jobs", job("busy-train", labels=OPT_IN), BUSY),
]
SERVICES = [
    service("idle-train-svc", {"job-name": "idle-train"}),
    service("busy-train-svc", {"job-name": "busy-train"}),
    service("web", {"app": "web"}),
    service("team-ml", {"team": "ml"}),  # selects idle-train's pod, and a notebook: shared
]
KIND = {"deployments": "Deployment", "statefulsets": "StatefulSet", "jobs": "Job"}


class Scenario:
    """The objects in the fake and their usage on the broker, for one cluster."""

    def __init__(self, kube: FakeKube, kafka_producer: Producer, codec: AvroCodec, cluster: str) -> None:
        self.kube, self.cluster = kube, cluster
        created = {obj["metadata"]["name"]: kube.create(plural, obj) for plural, obj, _ in WORKLOADS}
        self.uids = {name: obj["metadata"]["uid"] for name, obj in created.items()}
        for svc in SERVICES:
            kube.create("services", svc)
        labels = {"job-name": "idle-train", "team": "ml"}
        kube.create("pods", _pod("idle-train-0", labels, "Running", owner=created["idle-train"]))
        kube.create("pods", _pod("notebook", {"team": "ml"}, "Running"))
        self.producer, self.codec = kafka_producer, codec

    def publish_usage(self, end: datetime) -> None:
        """Each workload's segment as CHECKS windows of WINDOW_S seconds ending at ``end``, in one
        transaction as the worker writes them (the partitions end with a commit marker)."""
        self.producer.begin_transaction()
        for plural, obj, values in WORKLOADS:
            meta = obj["metadata"]
            for i, value in enumerate(values):
                start = end - timedelta(seconds=WINDOW_S * (CHECKS - i))
                row = WorkloadGpuUsage(
                    event_id=uuid.uuid4().hex,
                    cluster=self.cluster,
                    workload_uid=self.uids[meta["name"]],
                    workload_kind=KIND[plural],
                    workload_name=meta["name"],
                    namespace=meta["namespace"],
                    window_start=start,
                    window_end=start + timedelta(seconds=WINDOW_S),
                    gpus_allocated_avg=1.0,
                    gpus_allocated_max=1.0,
                    gpus_allocated_end=1.0,
                    utilization_avg=value,
                    utilization_max=value,
                    samples=0 if value is None else 1,
                    pods_active_end=1,
                )
                self.producer.produce(
                    WORKLOAD_USAGE.name,
                    key=record_key(WORKLOAD_USAGE, row),
                    value=self.codec.encode(WORKLOAD_USAGE, row),
                )
        self.producer.commit_transaction(30)


@pytest.fixture
def kube(request: pytest.FixtureRequest) -> Any:
    """The fake API server, granting what the reclaim ClusterRole grants (or ``param``)."""
    with FakeKube(allow=getattr(request, "param", GRANTS)) as fake:
        yield fake


@pytest.fixture
def kubeconfig(kube: FakeKube, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    cluster = {"name": "fake", "cluster": {"server": kube.url}}
    context = {"name": "fake", "context": {"cluster": "fake", "user": "me"}}
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "me", "user": {}}],
                "contexts": [context],
                "current-context": "fake",
            }
        )
    )
    return path


@pytest.fixture
def scenario(kube: FakeKube, platform: Any, codec: AvroCodec, unique: str) -> Scenario:
    producer = Producer(platform.kafka.librdkafka(**{"transactional.id": f"reclaim-test-{unique}"}))
    producer.init_transactions(30)
    return Scenario(kube, producer, codec, f"reclaim-{unique}")


def now_window() -> datetime:
    now = datetime.now(UTC)
    return now.replace(second=now.second // WINDOW_S * WINDOW_S, microsecond=0)


def write_policy(
    tmp_path: Path, cluster: str, action: str, *, interval_s: float = WINDOW_S, more: str = ""
) -> Path:
    path = tmp_path / f"{action}.toml"
    path.write_text(
        f'name = "sandbox-{action}"\ncluster = "{cluster}"\nnamespaces = ["{SANDBOX}"]\n'
        f'match_labels = {{ "gpulens.io/reclaim" = "enabled" }}\naction = "{action}"\n'
        f"[idle]\nchecks = {CHECKS}\ninterval_s = {interval_s}\ngpu_utilization_below = {BELOW}\n{more}"
    )
    return path


def reclaim(
    config_file: Path, kubeconfig: Path, *args: str, exit_code: int = 0, own_process: bool = False
) -> str:
    """``gpulens reclaim ARGS``'s output: in this process (click's runner: a process costs 5 s
    to start here), or ``own_process``."""
    argv = ["--config", str(config_file), "reclaim", *args, "--kubeconfig", str(kubeconfig)]
    if own_process:
        done = subprocess.run(
            [sys.executable, "-m", "gpulens", *argv], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == exit_code, done.stdout + done.stderr
        return done.stdout
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == exit_code, result.output + repr(result.exception)
    return result.output


def audit(platform: Any, codec: AvroCodec, cluster: str) -> dict[str, list[ReclaimDecision]]:
    """The cluster's decisions on the audit topic, read back from the broker, by run."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": f"audit-{uuid.uuid4().hex[:8]}"}))
    runs: dict[str, list[ReclaimDecision]] = defaultdict(list)
    try:
        partitions = (
            consumer.list_topics(RECLAIM_AUDIT.name, timeout=10).topics[RECLAIM_AUDIT.name].partitions
        )
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(RECLAIM_AUDIT.name, p), timeout=10)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(RECLAIM_AUDIT.name, p, 0) for p in partitions])
        left = {p for p, end in ends.items() if end > 0}
        while left:
            for msg in consumer.consume(500, timeout=1):
                assert msg.error() is None, msg.error()
                if msg.offset() + 1 >= ends[msg.partition()]:
                    left.discard(msg.partition())
                decision = codec.decode(RECLAIM_AUDIT, msg.value(), ReclaimDecision)
                if decision.cluster == cluster:
                    runs[decision.run_id].append(decision)
    finally:
        consumer.close()
    return runs


def verdicts(decisions: list[ReclaimDecision]) -> dict[str, tuple[ReclaimVerdict, str]]:
    return {d.workload_name: (d.verdict, d.reason) for d in decisions}


def expected(action: str, acted: ReclaimVerdict) -> dict[str, tuple[ReclaimVerdict, str]]:
    """What each workload's decision must be: from the CSV's labels and the test's own opt-ins."""
    kinds = {"annotate": {"Deployment", "StatefulSet", "Job"}, "scale-to-zero": {"Deployment", "StatefulSet"}}
    kinds["delete"] = {"Job"}
    out = {}
    for plural, obj, values in WORKLOADS:
        meta = obj["metadata"]
        opted = meta["namespace"] == SANDBOX and OPT_IN.items() <= meta["labels"].items()
        opted = opted and KIND[plural] in kinds[action]
        measured = None not in values
        idle = measured and max(values) < BELOW
        if opted:
            why = "busy" if measured else "unmeasured"
            out[meta["name"]] = (acted, "idle") if idle else (ReclaimVerdict.SKIPPED, why)
        elif idle:
            out[meta["name"]] = (ReclaimVerdict.SKIPPED, "not-opted-in")
    return out


# --- tests -------------------------------------------------------------------------------------


def test_the_trace_segments_are_what_the_test_says() -> None:
    assert len(IDLE) == len(BUSY) == CHECKS
    assert max(IDLE) < BELOW <= BUSY[0]
    assert max(BUSY[1:]) < BELOW


@pytest.mark.parametrize("action", ["annotate", "scale-to-zero", "delete"])
def test_a_dry_run_changes_nothing_and_audits_every_decision(
    action, scenario, kube, kubeconfig, config_file, platform, codec, tmp_path
) -> None:
    scenario.publish_usage(now_window())
    output = reclaim(
        config_file, kubeconfig, "run", "--policy", str(write_policy(tmp_path, scenario.cluster, action))
    )
    assert "dry run: nothing changed" in output
    assert kube.writes == []
    (decisions,) = audit(platform, codec, scenario.cluster).values()
    assert verdicts(decisions) == expected(action, ReclaimVerdict.WOULD_ACT)
    assert all(d.dry_run and d.policy == f"sandbox-{action}" for d in decisions)
    seen = {"busy": (max(BUSY), CHECKS - 1), "unmeasured": (None, 0)}
    for d in decisions:
        assert (d.utilization_max, d.idle_checks) == seen.get(d.reason, (max(IDLE), CHECKS))


def test_scale_to_zero_patches_only_the_idle_opted_in_workloads(
    scenario, kube, kubeconfig, config_file, platform, codec, tmp_path
) -> None:
    scenario.publish_usage(now_window())
    policy = write_policy(tmp_path, scenario.cluster, "scale-to-zero")
    reclaim(config_file, kubeconfig, "run", "--policy", str(policy), "--apply")
    scale = {"spec": {"replicas": 0}}
    assert sorted(kube.writes, key=lambda w: w.plural) == [
        Write("PATCH", "deployments", SANDBOX, "idle-serve", "scale", scale),
        Write("PATCH", "statefulsets", SANDBOX, "idle-db", "scale", scale),
    ]
    replicas = {
        name: kube.get(plural, name, namespace=ns)["spec"]["replicas"]
        for plural, name, ns in [
            ("deployments", "idle-serve", SANDBOX),
            ("statefulsets", "idle-db", SANDBOX),
            ("deployments", "busy-serve", SANDBOX),
            ("deployments", "idle-other", SANDBOX),
            ("deployments", "idle-elsewhere", "team-b"),
        ]
    }
    assert replicas == {"idle-serve": 0, "idle-db": 0, "busy-serve": 2, "idle-other": 2, "idle-elsewhere": 2}
    assert kube.get("deployments", "dark-serve", namespace=SANDBOX)["spec"]["replicas"] == 2
    (decisions,) = audit(platform, codec, scenario.cluster).values()
    assert verdicts(decisions) == expected("scale-to-zero", ReclaimVerdict.ACTED)
    acted = {d.workload_name: d.targets for d in decisions if d.verdict is ReclaimVerdict.ACTED}
    assert acted == {
        "idle-serve": [f"Deployment/{SANDBOX}/idle-serve"],
        "idle-db": [f"StatefulSet/{SANDBOX}/idle-db"],
    }
    assert {d.workload_uid for d in decisions if d.verdict is ReclaimVerdict.ACTED} == {
        scenario.uids["idle-serve"],
        scenario.uids["idle-db"],
    }


@pytest.mark.parametrize("kube", [GRANTS - {("apps", "statefulsets/scale", "patch")}], indirect=True)
def test_a_refused_action_is_audited_as_failed_and_the_run_goes_on(
    scenario, kube, kubeconfig, config_file, platform, codec, tmp_path
) -> None:
    scenario.publish_usage(now_window())
    policy = write_policy(tmp_path, scenario.cluster, "scale-to-zero")
    output = reclaim(config_file, kubeconfig, "run", "--policy", str(policy), "--apply", exit_code=1)
    assert "FAILED    StatefulSet/ml-sandbox/idle-db: PATCH" in output
    assert [(w.plural, w.name) for w in kube.writes] == [("deployments", "idle-serve")]
    (decisions,) = audit(platform, codec, scenario.cluster).values()
    failed = {d.workload_name: d.reason for d in decisions if d.verdict is ReclaimVerdict.FAILED}
    assert list(failed) == ["idle-db"]
    assert '403: statefulsets.apps "idle-db" is forbidden' in failed["idle-db"]
    assert verdicts(decisions) == expected("scale-to-zero", ReclaimVerdict.ACTED) | {
        "idle-db": (ReclaimVerdict.FAILED, failed["idle-db"])
    }


def test_delete_removes_only_the_idle_opted_in_job_and_its_service(
    scenario, kube, kubeconfig, config_file, platform, codec, tmp_path
) -> None:
    scenario.publish_usage(now_window())
    policy = write_policy(tmp_path, scenario.cluster, "delete")
    reclaim(config_file, kubeconfig, "run", "--policy", str(policy), "--apply", own_process=True)
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    assert kube.writes == [
        Write("DELETE", "jobs", SANDBOX, "idle-train", None, options),
        Write("DELETE", "services", SANDBOX, "idle-train-svc", None, None),
    ]
    left = {o["metadata"]["name"] for plural in ("jobs", "services") for o in _list(kube, plural)}
    assert left == {"busy-train", "busy-train-svc", "web", "team-ml"}
    (decisions,) = audit(platform, codec, scenario.cluster).values()
    assert verdicts(decisions) == expected("delete", ReclaimVerdict.ACTED)
    (deleted,) = [d for d in decisions if d.verdict is ReclaimVerdict.ACTED]
    assert deleted.targets == [f"Job/{SANDBOX}/idle-train", f"Service/{SANDBOX}/idle-train-svc"]
    assert deleted.action == "delete" and not deleted.dry_run


def test_annotate_marks_only_the_idle_opted_in_workloads(
    scenario, kube, kubeconfig, config_file, platform, codec, tmp_path
) -> None:
    scenario.publish_usage(now_window())
    reclaim(
        config_file,
        kubeconfig,
        "run",
        "--policy",
        str(write_policy(tmp_path, scenario.cluster, "annotate")),
        "--apply",
    )
    assert sorted((w.method, w.plural, w.name) for w in kube.writes) == [
        ("PATCH", "deployments", "idle-serve"),
        ("PATCH", "jobs", "idle-train"),
        ("PATCH", "statefulsets", "idle-db"),
    ]
    notes = {
        name: _annotations(kube.get(plural, name, namespace=SANDBOX)).get("gpulens.io/idle", "")
        for plural, name in [
            ("deployments", "idle-serve"),
            ("deployments", "busy-serve"),
            ("jobs", "idle-train"),
        ]
    }
    assert notes["busy-serve"] == ""
    assert notes["idle-serve"].startswith("policy sandbox-annotate: GPU utilization under 5%")
    assert kube.get("deployments", "idle-serve", namespace=SANDBOX)["spec"]["replicas"] == 2  # not scaled
    (decisions,) = audit(platform, codec, scenario.cluster).values()
    assert verdicts(decisions) == expected("annotate", ReclaimVerdict.ACTED)


def pod_metrics(workload_name: str, pod: str, *cpu: str) -> dict[str, Any]:
    """A PodMetrics as metrics-server serves it (labels copied from the pod, usage per container)."""
    return {
        "metadata": {
            "name": pod,
            "namespace": SANDBOX,
            "labels": {"app": workload_name, "pod-template-hash": "7d9c"},
        },
        "timestamp": "2026-11-24T15:00:00Z",
        "window": "10.0s",
        "containers": [
            {"name": f"c{i}", "usage": {"cpu": q, "memory": "103424Ki"}} for i, q in enumerate(cpu)
        ],
    }


def test_cpu_checks_keep_a_workload_whose_pods_still_compute(
    scenario, kube, kubeconfig, config_file, platform, codec, tmp_path
) -> None:
    # idle-serve: 19.873412 + 3 + 12 = 34.873412 millicores (two pods, one with two containers);
    # idle-db: 250 millicores; idle-train and the others have no PodMetrics
    kube.create("podmetrics", pod_metrics("idle-serve", "idle-serve-7d9c-a", "19873412n"))
    kube.create("podmetrics", pod_metrics("idle-serve", "idle-serve-7d9c-b", "3m", "12m"))
    kube.create("podmetrics", pod_metrics("idle-db", "idle-db-0", "250m"))
    scenario.publish_usage(now_window())
    policy = write_policy(
        tmp_path, scenario.cluster, "annotate", interval_s=0.05, more="cpu_millicores_below = 100\n"
    )
    reclaim(config_file, kubeconfig, "run", "--policy", str(policy), "--apply")
    assert [(w.plural, w.name) for w in kube.writes] == [("deployments", "idle-serve")]
    assert kube.count("GET", "podmetrics") == CHECKS  # idle-serve stays idle: every round is made
    (decisions,) = audit(platform, codec, scenario.cluster).values()
    cpu = {
        d.workload_name: (d.verdict, d.reason, d.cpu_millicores_max)
        for d in decisions
        if d.cpu_millicores_max or d.reason.startswith("cpu")
    }
    assert cpu == {
        "idle-serve": (ReclaimVerdict.ACTED, "idle", pytest.approx(19.873412 + 3 + 12)),
        "idle-db": (ReclaimVerdict.SKIPPED, "cpu-busy", 250.0),
        "idle-train": (ReclaimVerdict.SKIPPED, "cpu-unmeasured", None),
        # checks 0.05 s apart all fall in the newest window, where the BUSY segment is idle too
        "busy-serve": (ReclaimVerdict.SKIPPED, "cpu-unmeasured", None),
        "busy-train": (ReclaimVerdict.SKIPPED, "cpu-unmeasured", None),
    }


def test_stale_usage_decides_nothing_even_when_applying(
    scenario, kube, kubeconfig, config_file, platform, codec, tmp_path
) -> None:
    scenario.publish_usage(now_window() - timedelta(hours=2))  # a pipeline stopped two hours ago
    policy = write_policy(tmp_path, scenario.cluster, "scale-to-zero")
    reclaim(config_file, kubeconfig, "run", "--policy", str(policy), "--apply")
    assert kube.writes == []
    (decisions,) = audit(platform, codec, scenario.cluster).values()
    assert {d.workload_name: d.reason for d in decisions} == {
        name: "stale-usage" for name in ("idle-serve", "busy-serve", "dark-serve", "idle-db")
    }


def test_orphans_lists_what_was_left_behind(kube, kubeconfig, config_file) -> None:
    now = datetime.now(UTC)
    stamp = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    owner = kube.create("replicasets", {"metadata": {"name": "rs-live", "namespace": SANDBOX}})
    kube.create("pods", _pod("served", {"app": "served"}, "Running"))
    kube.create("pods", _pod("waiting-live", {}, "Pending", owner=owner))
    gone = kube.create("replicasets", {"metadata": {"name": "rs-gone", "namespace": SANDBOX}})
    kube.delete("replicasets", "rs-gone", namespace=SANDBOX)
    kube.create("pods", _pod("waiting-orphan", {}, "Pending", owner=gone))
    kube.create("services", service("served-svc", {"app": "served"}))
    kube.create("services", service("lonely-svc", {"app": "nothing"}))
    kube.create("services", {"metadata": {"name": "manual-endpoints", "namespace": SANDBOX}, "spec": {}})
    for name, ended, ttl in [
        ("expired", now - timedelta(hours=2), 3600),
        ("recent", now, 3600),
        ("kept", now - timedelta(days=9), None),
    ]:
        obj = job(name)
        obj["spec"]["ttlSecondsAfterFinished"] = ttl
        obj["status"] = {
            "completionTime": stamp(ended),
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": stamp(ended)}],
        }
        kube.create("jobs", obj)
    output = reclaim(config_file, kubeconfig, "orphans", "--json")
    found = [json.loads(line) for line in output.splitlines()]
    assert [(o["kind"], o["name"]) for o in found] == [
        ("Job", "expired"),
        ("Pod", "waiting-orphan"),
        ("Service", "lonely-svc"),
    ]
    assert "ttlSecondsAfterFinished 3600 passed" in found[0]["reason"]
    assert kube.writes == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            'name = "p"\ncluster = "c"\nnamespaces = ["a"]\nmatch_labels = {}\naction = "annotate"\n',
            "match_labels",
        ),
        (
            'name = "p"\ncluster = "c"\nnamespaces = ["*"]\nmatch_labels = {a = "b"}\naction = "annotate"\n',
            "namespaces",
        ),
        (
            'name = "p"\ncluster = "c"\nnamespaces = ["a"]\nmatch_labels = {a = "b"}\naction = "evict"\n',
            "action",
        ),
        (
            'name = "p"\ncluster = "c"\nnamespaces = ["a"]\nmatch_labels = {a = "b"}\naction = "delete"\n'
            "[idle]\nchecks = 0\n",
            "idle.checks",
        ),
        ('name = "p"\ncluster = "c"\nnamespace = ["a"]\n', "namespace: Extra inputs are not permitted"),
        ("name = \n", "not valid TOML"),
    ],
)
def test_a_bad_policy_is_refused_saying_what_to_fix(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=f"policy file {path}: .*{says}"):
        load_policy(path)


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    annotations: dict[str, str] = obj["metadata"].get("annotations") or {}
    return annotations


def _list(kube: FakeKube, plural: str) -> list[dict[str, Any]]:
    import urllib.request

    group = {"jobs": "/apis/batch/v1", "services": "/api/v1"}[plural]
    with urllib.request.urlopen(f"{kube.url}{group}/namespaces/{SANDBOX}/{plural}") as answer:
        items: list[dict[str, Any]] = json.load(answer)["items"]
    return items


def _pod(
    name: str, labels: dict[str, str], phase: str, *, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    refs = []
    if owner is not None:
        meta = owner["metadata"]
        refs = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
            }
        ]
    return {
        "metadata": {"name": name, "namespace": SANDBOX, "labels": labels, "ownerReferences": refs},
        "spec": {"containers": []},
        "status": {"phase": phase},
    }
