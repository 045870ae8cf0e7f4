"""A kubelet pod-resources server: the real gRPC server and generated servicer on a unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from gpulens.protos.podresources.v1 import api_pb2, api_pb2_grpc
from gpulens.testing.grpc_sockets import unix_socket_server

Pods = dict[tuple[str, str], dict[str, list[str]]]
"""(namespace, pod) -> resource name -> device ids, all in one container "main"."""


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List with whatever ``pods`` holds now, as the kubelet does."""

    def __init__(self) -> None:
        self.pods: Pods = {}

    def List(self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=name,
                    namespace=namespace,
                    containers=[
                        api_pb2.ContainerResources(
                            name="main",
                            devices=[
                                api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                                for resource, ids in resources.items()
                            ],
                        ),
                        api_pb2.ContainerResources(name="sidecar"),  # holds nothing: never an event
                    ],
                )
                for (namespace, name), resources in self.pods.items()
            ]
        )


@contextmanager
def serving(socket_path: Path) -> Iterator[Kubelet]:
    """A kubelet answering on ``socket_path`` until the block ends."""
    servicer = Kubelet()
    with unix_socket_server(
        socket_path, partial(api_pb2_grpc.add_PodResourcesListerServicer_to_server, servicer), workers=2
    ):
        yield servicer
