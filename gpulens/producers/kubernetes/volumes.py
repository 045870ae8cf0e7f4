"""PersistentVolumes, with their claims, StorageClasses and kubelet usage -> StorageEvent.

Pure: no I/O, no clock. A volume's event joins four sources, kept in :class:`StorageContext`:
the PersistentVolume (kind, driver, class, node of a local volume), its bound claim (namespace,
name, the capacity the filesystem has now: a claim's ``status.capacity`` follows an expansion
once the node has resized it), its StorageClass (the provisioner, the driver of volumes whose
spec names none, such as NFS provisioned by nfs-subdir-external-provisioner) and the usage the
kubelets report for the claim (:class:`VolumeUsage`, from ``/stats/summary``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.quantities import whole
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import ChangeType, StorageEvent

ClaimKey = tuple[str, str]
"""(namespace, name) of a PersistentVolumeClaim."""

_KEYWORDS = ("juicefs", "lustre", "nfs")
"""Kinds recognised in a driver's name when the settings do not list it."""
_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
_NODE_LABELS = frozenset({"kubernetes.io/hostname"})


@dataclass(frozen=True, slots=True)
class VolumeUsage:
    """What one kubelet measured of a claim's filesystem (``pods[].volume[]`` of its summary)."""

    claim: ClaimKey
    time: datetime
    used_bytes: int | None
    available_bytes: int | None


def summary_usage(summary: Mapping[str, Any]) -> Iterator[VolumeUsage]:
    """The claims' usage in a kubelet's ``/stats/summary`` (volumes without ``pvcRef`` are no claim)."""
    for pod in summary.get("pods") or ():
        for volume in pod.get("volume") or ():
            ref, when = volume.get("pvcRef"), volume.get("time")
            if not ref or not when:
                continue
            yield VolumeUsage(
                claim=(ref.get("namespace", ""), ref["name"]),
                time=datetime.fromisoformat(when),
                used_bytes=volume.get("usedBytes"),
                available_bytes=volume.get("availableBytes"),
            )


def claim_of(volume: RawObject) -> ClaimKey | None:
    """The claim a PersistentVolume is bound to (``spec.claimRef``), None when unbound."""
    ref = (volume.get("spec") or {}).get("claimRef")
    return (ref.get("namespace", ""), ref["name"]) if ref and ref.get("name") else None


@dataclass(slots=True)
class StorageContext:
    """The latest claims, StorageClasses and usage, by the keys volumes refer to them with."""

    claims: dict[ClaimKey, RawObject] = field(default_factory=dict)
    classes: dict[str, RawObject] = field(default_factory=dict)
    usage: dict[ClaimKey, VolumeUsage] = field(default_factory=dict)

    def measured(self, reports: Iterable[VolumeUsage]) -> set[ClaimKey]:
        """Keep the newest measurement of each claim (a shared filesystem is reported by every node
        that mounts it, each at its own time); the claims whose usage changed."""
        changed = set()
        for report in reports:
            known = self.usage.get(report.claim)
            if known is None or report.time > known.time:
                self.usage[report.claim] = report
                changed.add(report.claim)
        return changed


@dataclass(frozen=True, slots=True)
class VolumeTranslator:
    """Turns PersistentVolumes of one cluster into StorageEvents; ``kinds``: driver -> storage_kind."""

    cluster: str
    source: str
    kinds: Mapping[str, str]

    def volume(
        self, obj: RawObject, context: StorageContext, *, change: ChangeType, at: datetime
    ) -> StorageEvent:
        """The volume's full state with what the context knows of its claim, class and usage."""
        meta, spec = obj["metadata"], obj.get("spec") or {}
        claim_key = claim_of(obj)
        claim = context.claims.get(claim_key) if claim_key else None
        class_name = spec.get("storageClassName") or None
        storage_class = context.classes.get(class_name) if class_name else None
        usage = context.usage.get(claim_key) if claim_key else None
        source_type, source = _volume_source(spec)
        driver = (
            (source.get("driver") if source_type == "csi" else None)
            or (storage_class or {}).get("provisioner")
            or (meta.get("annotations") or {}).get(_PROVISIONED_BY)
        )
        claim_capacity = ((claim or {}).get("status") or {}).get("capacity", {}).get("storage")
        capacity = claim_capacity or (spec.get("capacity") or {}).get("storage")
        return StorageEvent(
            event_id=event_id(
                self.cluster,
                "PersistentVolume",
                meta.get("uid") or meta["name"],
                meta.get("resourceVersion"),
                (claim or {}).get("metadata", {}).get("resourceVersion"),
                (storage_class or {}).get("metadata", {}).get("resourceVersion"),
                usage.time.isoformat() if usage else None,
                change.value,
            ),
            cluster=self.cluster,
            event_time=at,
            source=self.source,
            type=change,
            node=_local_node(spec) if source_type in ("local", "hostPath") else None,
            storage_kind=self._kind(source_type, driver),
            name=meta["name"],
            namespace=claim_key[0] if claim_key else None,
            storage_class=class_name,
            mount_point=_mount_source(source_type, source),
            capacity_bytes=None if capacity is None else whole(capacity),
            used_bytes=usage.used_bytes if usage else None,
            available_bytes=usage.available_bytes if usage else None,
            labels=meta.get("labels") or {},
            driver=driver,
            claim=claim_key[1] if claim_key else None,
        )

    def _kind(self, source_type: str | None, driver: str | None) -> str:
        """In-tree NFS, hostPath and local by the spec; CSI and provisioned volumes by their driver."""
        if source_type not in (None, "csi"):
            return source_type.lower()
        if driver:
            if driver in self.kinds:
                return self.kinds[driver]
            for keyword in _KEYWORDS:
                if keyword in driver.lower():
                    return keyword
        return "csi"


def _volume_source(spec: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any]]:
    """The spec's volume source: its key (``nfs``, ``csi``, ``hostPath``, ``local``, ...) and body.

    A PersistentVolumeSpec holds exactly one source beside its common fields."""
    for key, value in spec.items():
        if key not in _COMMON_SPEC_FIELDS and isinstance(value, Mapping):
            return key, value
    return None, {}


_COMMON_SPEC_FIELDS = frozenset(
    {
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeAttributesClassName",
        "volumeMode",
    }
)


def _mount_source(source_type: str | None, source: Mapping[str, Any]) -> str | None:
    """The node's directory of a local or hostPath volume; ``server:/export`` of an NFS one."""
    if source_type in ("local", "hostPath"):
        return source.get("path")
    if source_type == "nfs":
        return f"{source.get('server')}:{source.get('path')}"
    return None


def _local_node(spec: Mapping[str, Any]) -> str | None:
    """The node a local volume lives on: its required node affinity on the hostname label."""
    required = ((spec.get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms") or ()
    for term in required:
        for expression in term.get("matchExpressions") or ():
            values = expression.get("values") or ()
            if expression.get("key") in _NODE_LABELS and expression.get("operator") == "In" and values:
                return str(values[0])
    return None
