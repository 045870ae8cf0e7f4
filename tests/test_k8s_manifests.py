"""The Kubernetes manifests in ``deploy/k8s/`` against the code they run.

Every document is read as the official ``kubernetes`` client model of its kind, and must come
back unchanged from it (a misspelt or misplaced field is dropped by the model, so the round
trip catches it). Every container's command is parsed by the ``gpulens`` click command it
names, without running it; the ConfigMap's settings file, with each container's ``GPULENS_*``
variables, is loaded by the project's settings class; ports, probes, host paths and RBAC are
checked against what the settings and the watcher's resource list say. With ``kubectl`` on
PATH, kustomize builds the directory and ``kubectl apply --dry-run=client`` maps every object,
against a fake API server that serves only discovery (no cluster is reachable here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from kubernetes.client import ApiClient
from pydantic import BaseModel

from gpulens.cli import cli
from gpulens.cli_context import with_flags
from gpulens.config import ENV_PREFIX, GPULensSettings, load_settings
from gpulens.producers.kubernetes.resources import (
    BUILTIN_WORKLOADS,
    CLAIMS,
    KUEUE_WORKLOADS,
    NODES,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
)

K8S_DIR = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
KUSTOMIZATION = "kustomization.yaml"
NAMESPACE = "gpulens"
CONFIG_MAP = "gpulens-config"
CONFIG_KEY = "gpulens.toml"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class ApiKind:
    """A kind the manifests may use: where the API serves it and which client model reads it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def model(self) -> str:
        """The ``kubernetes.client`` model class name, e.g. ``V1DaemonSet``."""
        return f"{self.version.capitalize()}{self.kind}"


KINDS: dict[tuple[str, str], ApiKind] = {
    (k.api_version, k.kind): k
    for k in (
        ApiKind("", "v1", "Namespace", "namespaces", namespaced=False),
        ApiKind("", "v1", "ConfigMap", "configmaps"),
        ApiKind("", "v1", "Secret", "secrets"),
        ApiKind("", "v1", "Service", "services"),
        ApiKind("", "v1", "ServiceAccount", "serviceaccounts"),
        ApiKind("apps", "v1", "DaemonSet", "daemonsets"),
        ApiKind("apps", "v1", "Deployment", "deployments"),
        ApiKind("apps", "v1", "StatefulSet", "statefulsets"),
        ApiKind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False),
        ApiKind(
            "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", namespaced=False
        ),
        ApiKind("rbac.authorization.k8s.io", "v1", "Role", "roles"),
        ApiKind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings"),
    )
}
"""Every kind the manifests may hold; anything else is an error."""

WORKLOAD_KINDS = ("DaemonSet", "Deployment", "StatefulSet")


@dataclass(frozen=True)
class Document:
    file: str
    doc: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.file}:{self.doc.get('kind')}/{self.doc.get('metadata', {}).get('name')}"


@dataclass(frozen=True)
class Container:
    workload: dict[str, Any]
    container: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.workload['metadata']['name']}/{self.container['name']}"

    @property
    def pod_spec(self) -> dict[str, Any]:
        return self.workload["spec"]["template"]["spec"]

    @property
    def argv(self) -> list[str]:
        return [*self.container.get("command", []), *self.container.get("args", [])]

    @property
    def env(self) -> list[dict[str, Any]]:
        return list(self.container.get("env", []))

    def literal_env(self) -> dict[str, str]:
        return {e["name"]: e["value"] for e in self.env if "value" in e}


def _load_documents() -> list[Document]:
    documents = []
    for path in sorted(K8S_DIR.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                documents.append(Document(path.name, doc))
    return documents


DOCUMENTS = _load_documents()
RESOURCES = [d for d in DOCUMENTS if d.file != KUSTOMIZATION]
WORKLOADS = [d.doc for d in RESOURCES if d.doc.get("kind") in WORKLOAD_KINDS]
CONTAINERS = [
    Container(w, c)
    for w in WORKLOADS
    for c in [
        *w["spec"]["template"]["spec"].get("initContainers", []),
        *w["spec"]["template"]["spec"]["containers"],
    ]
]
AGENTS = [c for c in CONTAINERS if c.argv[1:2] == ["agent"]]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d.doc for d in RESOURCES if d.doc["kind"] == kind and d.doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} documents"
    return found[0]


def _config_text() -> str:
    return str(_one("ConfigMap", CONFIG_MAP)["data"][CONFIG_KEY])


def _cli_envvars() -> set[str]:
    """Environment variables the ``gpulens`` group reads itself (GPULENS_CONFIG)."""
    return {p.envvar for p in cli.params if isinstance(p.envvar, str)}


def _is_setting(name: str) -> bool:
    """Whether ``GPULENS_A__B`` names a field of the settings (a key below a dict field counts)."""
    if not name.startswith(ENV_PREFIX):
        return False
    model: type[BaseModel] = GPULensSettings
    parts = name.removeprefix(ENV_PREFIX).lower().split("__")
    for position, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        if position == len(parts) - 1:
            return True
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return typing.get_origin(annotation) is dict
    return True


def _parse(container: Container) -> click.Context:
    """The container's command line parsed by the gpulens subcommand it names, not run."""
    argv = container.argv
    assert argv[:1] == ["gpulens"], f"{container.id}: runs {argv[:1]}, not gpulens"
    assert len(argv) > 1, f"{container.id}: no subcommand"
    parent = click.Context(cli, info_name="gpulens")
    command = cli.get_command(parent, argv[1])
    assert command is not None, f"{container.id}: no command `gpulens {argv[1]}`"
    return command.make_context(argv[1], argv[2:], parent=parent)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name == "NODE_NAME":
            monkeypatch.delenv(name)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / CONFIG_KEY
    path.write_text(_config_text())
    return path


def _settings_of(container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch) -> GPULensSettings:
    """The settings the container gets: the ConfigMap's file and its own literal GPULENS_* values."""
    for name, value in container.literal_env().items():
        if _is_setting(name):
            monkeypatch.setenv(name, value)
    return load_settings(config_file)


# --- documents --------------------------------------------------------------------------------


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.id)
def test_document_is_a_mapping_with_a_kind(document: Document) -> None:
    assert isinstance(document.doc, dict)
    assert {"apiVersion", "kind"} <= document.doc.keys()


@pytest.mark.parametrize("document", RESOURCES, ids=lambda d: d.id)
def test_kind_is_known(document: Document) -> None:
    key = (document.doc["apiVersion"], document.doc["kind"])
    assert key in KINDS, f"unknown kind {key}; add it to KINDS if it is meant"


@pytest.mark.parametrize("document", RESOURCES, ids=lambda d: d.id)
def test_document_reads_as_its_client_model_without_loss(document: Document) -> None:
    api_kind = KINDS[(document.doc["apiVersion"], document.doc["kind"])]
    with ApiClient() as client:
        model = client.deserialize(json.dumps(document.doc), api_kind.model, "application/json")
        assert type(model).__name__ == api_kind.model
        assert client.sanitize_for_serialization(model) == document.doc


@pytest.mark.parametrize("document", RESOURCES, ids=lambda d: d.id)
def test_namespaced_objects_are_in_the_gpulens_namespace(document: Document) -> None:
    api_kind = KINDS[(document.doc["apiVersion"], document.doc["kind"])]
    assert document.doc["metadata"].get("namespace") == (NAMESPACE if api_kind.namespaced else None)


def test_kustomization_lists_every_manifest_file() -> None:
    (kustomization,) = [d.doc for d in DOCUMENTS if d.file == KUSTOMIZATION]
    assert kustomization["namespace"] == NAMESPACE
    assert sorted(kustomization["resources"]) == sorted({d.file for d in RESOURCES})


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w["metadata"]["name"])
def test_selector_matches_the_pod_template(workload: dict[str, Any]) -> None:
    selector = workload["spec"]["selector"]["matchLabels"]
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_selectors_are_distinct() -> None:
    selectors = [tuple(sorted(w["spec"]["selector"]["matchLabels"].items())) for w in WORKLOADS]
    assert len(set(selectors)) == len(selectors)


# --- commands and settings ---------------------------------------------------------------------


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.id)
def test_command_is_a_gpulens_subcommand_whose_options_parse(container: Container) -> None:
    try:
        _parse(container)
    except click.ClickException as err:
        pytest.fail(f"{container.id}: {' '.join(container.argv)}: {err.format_message()}")


def test_configmap_settings_file_validates(config_file: Path) -> None:
    assert isinstance(load_settings(config_file), GPULensSettings)


def test_configmap_uses_external_services_only(config_file: Path) -> None:
    platform = load_settings(config_file).platform
    assert (platform.broker, platform.registry, platform.clickhouse) == ("external",) * 3


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.id)
def test_gpulens_variables_name_real_settings(container: Container) -> None:
    names = {e["name"] for e in container.env if e["name"].startswith(ENV_PREFIX)}
    unknown = sorted(n for n in names if not _is_setting(n) and n not in _cli_envvars())
    assert unknown == []


@pytest.mark.parametrize(
    ("name", "real"),
    [
        ("GPULENS_KAFKA__BOOTSTRAP_SERVERS", True),
        ("GPULENS_WATCHER__LEASE__NAMESPACE", True),
        ("GPULENS_KAFKA__EXTRA__SSL_CA_LOCATION", True),
        ("GPULENS_KAFKA__BOOTSTRAP_SERVER", False),
        ("GPULENS_AGENT__NODE__NAME", False),
        ("GPULENS_CONFIG", False),
    ],
)
def test_setting_name_check_tells_real_from_unknown(name: str, real: bool) -> None:
    assert _is_setting(name) is real


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.id)
def test_container_settings_validate(
    container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(_settings_of(container, config_file, monkeypatch), GPULensSettings)


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.id)
def test_config_file_is_the_mounted_configmap(container: Container) -> None:
    path = Path(container.literal_env()["GPULENS_CONFIG"])
    volumes = {v["name"]: v for v in container.pod_spec["volumes"]}
    mounted = [
        m
        for m in container.container["volumeMounts"]
        if Path(m["mountPath"]) == path.parent
        and volumes[m["name"]].get("configMap", {}).get("name") == CONFIG_MAP
    ]
    assert mounted, f"{path.parent} is not a mount of ConfigMap {CONFIG_MAP}"
    assert path.name == CONFIG_KEY


# --- ports and probes --------------------------------------------------------------------------


def _served_ports(container: Container, settings: GPULensSettings) -> set[int]:
    """Ports the process listens on, reachable from other pods (not bound to loopback)."""
    context = _parse(container)
    params = context.params
    name = context.info_name
    ports: set[tuple[str, int]] = set()
    if name == "agent" and settings.agent.metrics_port:
        ports.add((settings.agent.metrics_host, settings.agent.metrics_port))
    if name == "gateway":
        gateway = with_flags(settings.gateway, context)
        ports.add((gateway.host, gateway.port))
        if gateway.metrics_port:
            ports.add((gateway.metrics_host, gateway.metrics_port))
    if name == "exporter":
        exporter = with_flags(settings.exporter, context)
        ports.add((exporter.host, exporter.port))
    if name == "api":
        api = with_flags(settings.api, context)
        ports.add((api.host, api.port))
    if name == "sink" and params["metrics_port"] is not None:
        ports.add((params["metrics_host"], params["metrics_port"]))
    if name == "worker":
        pipeline = with_flags(settings.pipeline, context)
        if pipeline.metrics_port is not None:
            ports.add((pipeline.metrics_host, pipeline.metrics_port))
    return {port for host, port in ports if host not in LOOPBACK}


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.id)
def test_container_ports_are_the_ports_the_process_serves(
    container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings_of(container, config_file, monkeypatch)
    declared = {p["containerPort"] for p in container.container.get("ports", [])}
    assert declared == _served_ports(container, settings)


def _probe_port(probe: dict[str, Any]) -> int | str:
    for handler in ("httpGet", "tcpSocket", "grpc"):
        if handler in probe:
            return typing.cast(int | str, probe[handler]["port"])
    raise AssertionError(f"probe without a network handler: {probe}")


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.id)
def test_probes_check_a_declared_port(container: Container) -> None:
    ports = container.container.get("ports", [])
    known = {p["containerPort"] for p in ports} | {p["name"] for p in ports if "name" in p}
    probes = [
        container.container[k]
        for k in ("livenessProbe", "readinessProbe", "startupProbe")
        if k in container.container
    ]
    assert all(_probe_port(p) in known for p in probes)


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.id)
def test_a_container_with_ports_is_probed(container: Container) -> None:
    if container.container.get("ports"):
        assert {"livenessProbe", "readinessProbe"} <= container.container.keys()
    else:
        assert not {"livenessProbe", "readinessProbe", "startupProbe"} & container.container.keys()


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w["metadata"]["name"])
def test_scrape_annotation_names_a_container_port(workload: dict[str, Any]) -> None:
    annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true":
        pytest.skip("not scraped")
    containers = workload["spec"]["template"]["spec"]["containers"]
    ports = {p["containerPort"] for c in containers for p in c.get("ports", [])}
    assert int(annotations["prometheus.io/port"]) in ports


@pytest.mark.parametrize(
    "service", [d.doc for d in RESOURCES if d.doc["kind"] == "Service"], ids=lambda s: s["metadata"]["name"]
)
def test_service_targets_ports_of_its_pods(service: dict[str, Any]) -> None:
    selector = service["spec"]["selector"]
    pods = [w for w in WORKLOADS if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
    assert pods, f"no workload matches {selector}"
    names = {
        p.get("name") for w in pods for c in w["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


# --- security ----------------------------------------------------------------------------------


@pytest.mark.parametrize("container", [c for c in CONTAINERS if c not in AGENTS], ids=lambda c: c.id)
def test_non_agent_containers_run_as_non_root(container: Container) -> None:
    pod = container.pod_spec.get("securityContext", {})
    own = container.container.get("securityContext", {})
    assert own.get("runAsNonRoot", pod.get("runAsNonRoot")) is True
    assert own.get("runAsUser", pod.get("runAsUser", 1)) != 0
    assert own.get("privileged", False) is False


# --- the node agent ----------------------------------------------------------------------------


def _host_path_mounts(container: Container) -> dict[Path, tuple[str, bool]]:
    """Mount path -> (host path, read-only) of the container's hostPath volumes."""
    volumes = {v["name"]: v for v in container.pod_spec["volumes"]}
    return {
        Path(m["mountPath"]): (volumes[m["name"]]["hostPath"]["path"], m.get("readOnly", False))
        for m in container.container["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }


def test_there_are_agents() -> None:
    assert AGENTS


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.id)
def test_agent_mounts_the_kubelet_pod_resources_socket(
    container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket = _settings_of(container, config_file, monkeypatch).agent.pod_resources_socket
    assert _host_path_mounts(container).get(socket.parent, ("", False))[0] == "/var/lib/kubelet/pod-resources"


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.id)
def test_agent_mounts_the_containerd_socket_read_only(
    container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings_of(container, config_file, monkeypatch).agent
    assert "containerd" in settings.collectors
    socket = settings.containerd_socket
    assert _host_path_mounts(container).get(socket.parent) == ("/run/containerd", True)


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.id)
def test_agent_reads_the_host_sysfs_read_only(
    container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs = _settings_of(container, config_file, monkeypatch).agent.sysfs_root
    assert _host_path_mounts(container).get(sysfs) == ("/sys", True)


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.id)
def test_agent_spools_on_the_node(
    container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = _settings_of(container, config_file, monkeypatch).agent.spool_dir
    assert spool.is_absolute()
    assert spool in _host_path_mounts(container)


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.id)
def test_agent_gets_its_node_name_from_the_downward_api(container: Container) -> None:
    (node,) = [e for e in container.env if e["name"] == "NODE_NAME"]
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.id)
def test_amd_agent_opens_the_amd_devices(
    container: Container, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "amd" not in _settings_of(container, config_file, monkeypatch).agent.collectors:
        pytest.skip("no amd collector")
    mounts = _host_path_mounts(container)
    assert (mounts.get(Path("/dev/kfd")), mounts.get(Path("/dev/dri"))) == (
        ("/dev/kfd", False),
        ("/dev/dri", False),
    )
    assert container.container["securityContext"].get("privileged") is True


def test_agents_tolerate_both_gpu_taints() -> None:
    keys = {t.get("key") for c in AGENTS for t in c.pod_spec.get("tolerations", [])}
    assert {"amd.com/gpu", "nvidia.com/gpu"} <= keys


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.id)
def test_agent_requests_its_measured_footprint(container: Container) -> None:
    # bench.agent_overhead: 0.2 % of one core, 110 MB RSS.
    resources = container.container["resources"]
    assert resources["requests"] == {"cpu": "5m", "memory": "128Mi"}
    assert resources["limits"]["memory"] == "256Mi"


# --- the watcher and its RBAC ------------------------------------------------------------------


def _watcher() -> dict[str, Any]:
    (watcher,) = [c.workload for c in CONTAINERS if c.argv[1:2] == ["watch"]]
    return watcher


def _bound_to(kind: str, binding_kind: str, service_account: str) -> list[dict[str, Any]]:
    """The rules of every ``kind`` bound to the watcher's ServiceAccount."""
    rules = []
    for binding in (d.doc for d in RESOURCES if d.doc["kind"] == binding_kind):
        subjects = binding.get("subjects", [])
        if any(s["kind"] == "ServiceAccount" and s["name"] == service_account for s in subjects):
            assert binding["roleRef"]["kind"] == kind
            rules.extend(_one(kind, binding["roleRef"]["name"])["rules"])
    return rules


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verbs: set[str]) -> bool:
    granted: set[str] = set()
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"]:
            granted |= set(rule["verbs"])
    return verbs <= granted


def test_watcher_runs_in_cluster() -> None:
    (container,) = _watcher()["spec"]["template"]["spec"]["containers"]
    assert "--in-cluster" in container["args"]


def test_watcher_replicas_elect_a_leader(config_file: Path) -> None:
    assert _watcher()["spec"]["replicas"] == 2
    assert load_settings(config_file).watcher.lease.enabled


@pytest.mark.parametrize(
    "kind",
    [NODES, PODS, *BUILTIN_WORKLOADS, KUEUE_WORKLOADS, PERSISTENT_VOLUMES, CLAIMS, STORAGE_CLASSES],
    ids=lambda k: k.key,
)
def test_watcher_may_read_what_it_watches(kind: Any) -> None:
    account = _watcher()["spec"]["template"]["spec"]["serviceAccountName"]
    rules = _bound_to("ClusterRole", "ClusterRoleBinding", account)
    assert _allows(rules, kind.group, kind.plural, {"get", "list", "watch"})


def test_watcher_may_read_kubelet_summaries_through_the_node_proxy_and_nothing_more() -> None:
    account = _watcher()["spec"]["template"]["spec"]["serviceAccountName"]
    rules = _bound_to("ClusterRole", "ClusterRoleBinding", account)
    assert _allows(rules, "", "nodes/proxy", {"get"})
    assert not any(
        _allows(rules, "", "nodes/proxy", {verb}) for verb in ("create", "update", "patch", "delete")
    )


def test_watcher_may_hold_the_lease_in_its_namespace(config_file: Path) -> None:
    lease = load_settings(config_file).watcher.lease
    account = _watcher()["spec"]["template"]["spec"]["serviceAccountName"]
    roles = [
        _one("Role", b["roleRef"]["name"])
        for b in (d.doc for d in RESOURCES if d.doc["kind"] == "RoleBinding")
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    rules = [r for role in roles if role["metadata"]["namespace"] == lease.namespace for r in role["rules"]]
    assert _allows(rules, "coordination.k8s.io", "leases", {"get", "create", "update"})


# --- idle reclaim's RBAC ------------------------------------------------------------------------

RECLAIM_ACCOUNT = "gpulens-reclaim"
READ_VERBS = {"get", "list", "watch"}


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_the_watcher_may_only_read() -> None:
    account = _watcher()["spec"]["template"]["spec"]["serviceAccountName"]
    assert account != RECLAIM_ACCOUNT
    cluster_wide = _grants(_bound_to("ClusterRole", "ClusterRoleBinding", account))
    assert {verb for _, _, verb in cluster_wide} <= READ_VERBS


def test_reclaim_writes_only_what_its_actions_change() -> None:
    from gpulens.producers.reclaim.policy import KINDS_OF, Action

    where = {
        "Deployment": ("apps", "deployments"),
        "StatefulSet": ("apps", "statefulsets"),
        "Job": ("batch", "jobs"),
    }
    needed = {(*where[kind], "patch") for kind in KINDS_OF[Action.ANNOTATE]}
    needed |= {
        (where[kind][0], f"{where[kind][1]}/scale", "patch") for kind in KINDS_OF[Action.SCALE_TO_ZERO]
    }
    needed |= {(*where[kind], "delete") for kind in KINDS_OF[Action.DELETE]} | {("", "services", "delete")}
    granted = _grants(_bound_to("ClusterRole", "ClusterRoleBinding", RECLAIM_ACCOUNT))
    assert {g for g in granted if g[2] not in READ_VERBS} == needed
    assert all("*" not in grant for grant in granted)
    assert not any(verb == "watch" or resource == "secrets" for _, resource, verb in granted)


# --- kubectl -----------------------------------------------------------------------------------


KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


def _kubectl(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
    return subprocess.run([KUBECTL, *args], capture_output=True, text=True, timeout=120, env=env, check=False)


@needs_kubectl
def test_kustomize_builds_the_manifests_unchanged(tmp_path: Path) -> None:
    built = _kubectl("kustomize", str(K8S_DIR), home=tmp_path)
    assert built.returncode == 0, built.stderr
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(yaml.safe_load_all(built.stdout), key=key) == sorted((d.doc for d in RESOURCES), key=key)


class _DiscoveryOnly(BaseHTTPRequestHandler):
    """Answers API discovery for :data:`KINDS`, and 404 to everything else (nothing exists)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        body = _discovery(path)
        if body is None:
            self._reply(
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                },
            )
        else:
            self._reply(200, body)

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _discovery(path: str) -> dict[str, Any] | None:
    group_versions = sorted({(k.group, k.version) for k in KINDS.values()})
    if path == "/version":
        return {"major": "1", "minor": "32", "gitVersion": "v1.32.0"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups = []
        for group, version in group_versions:
            if group:
                entry = {"groupVersion": f"{group}/{version}", "version": version}
                groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    for group, version in group_versions:
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if path == prefix:
            resources = [
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
                for k in KINDS.values()
                if (k.group, k.version) == (group, version)
            ]
            gv = f"{group}/{version}" if group else version
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
    return None


@pytest.fixture
def discovery_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DiscoveryOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@needs_kubectl
def test_kubectl_apply_dry_run_maps_every_object(tmp_path: Path, discovery_server: str) -> None:
    applied = _kubectl(
        "apply",
        "--dry-run=client",
        "--validate=false",
        f"--server={discovery_server}",
        f"--cache-dir={tmp_path / 'cache'}",
        "-o",
        "name",
        "-k",
        str(K8S_DIR),
        home=tmp_path,
    )
    assert applied.returncode == 0, applied.stderr
    expected = set()
    for document in RESOURCES:
        api_kind = KINDS[(document.doc["apiVersion"], document.doc["kind"])]
        kind = f"{api_kind.kind.lower()}.{api_kind.group}" if api_kind.group else api_kind.kind.lower()
        expected.add(f"{kind}/{document.doc['metadata']['name']}")
    assert set(applied.stdout.split()) == expected
