"""Which container holds which device, from the kubelet's pod-resources gRPC API (v1 List)."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path

import grpc

from gpulens.producers.agent.collecting import ContainerKey
from gpulens.producers.agent.exceptions import CollectionError, CollectorUnavailable
from gpulens.protos.podresources.v1 import api_pb2, api_pb2_grpc
from gpulens.schemas.model.models import DeviceAssignment, DeviceKind


def device_kind(resource_name: str, *, gpu: tuple[str, ...], rdma: tuple[str, ...]) -> DeviceKind:
    """GPU, RDMA or OTHER by the device plugin's resource name (shell patterns)."""
    if any(fnmatchcase(resource_name, pattern) for pattern in gpu):
        return DeviceKind.GPU
    if any(fnmatchcase(resource_name, pattern) for pattern in rdma):
        return DeviceKind.RDMA
    return DeviceKind.OTHER


class PodResourcesCollector:
    """Lists pod resources over the kubelet's unix socket, one call per round."""

    name = "pod-resources"

    def __init__(
        self,
        socket_path: Path,
        *,
        timeout_s: float = 5.0,
        gpu_patterns: tuple[str, ...] = (),
        rdma_patterns: tuple[str, ...] = (),
    ) -> None:
        self._path = socket_path
        self._timeout = timeout_s
        self._gpu, self._rdma = gpu_patterns, rdma_patterns
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def start(self) -> None:
        if not self._path.is_socket():
            raise CollectorUnavailable(
                f"no kubelet pod-resources socket at {self._path} (mount /var/lib/kubelet/pod-resources)"
            )
        self._channel = grpc.insecure_channel(f"unix://{self._path.resolve()}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None

    def assignments(self) -> Mapping[ContainerKey, tuple[DeviceAssignment, ...]]:
        assert self._stub is not None, "start() first"
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as err:
            code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            raise CollectionError(f"pod-resources List on {self._path}: {code}: {details}") from err
        held: dict[ContainerKey, tuple[DeviceAssignment, ...]] = {}
        for pod in response.pod_resources:
            for container in pod.containers:
                devices = tuple(
                    sorted(
                        (
                            DeviceAssignment(
                                resource_name=group.resource_name,
                                device_id=device_id,
                                kind=device_kind(group.resource_name, gpu=self._gpu, rdma=self._rdma),
                            )
                            for group in container.devices
                            for device_id in group.device_ids
                        ),
                        key=lambda d: (d.resource_name, d.device_id),
                    )
                )
                if devices:
                    held[(pod.namespace, pod.name, container.name)] = devices
        return held
