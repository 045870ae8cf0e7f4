"""gRPC servers on a unix socket, as the node's daemons serve (kubelet, containerd), for the fakes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc


@contextmanager
def unix_socket_server(
    socket_path: Path, register: Callable[[grpc.Server], None], *, workers: int = 4
) -> Iterator[None]:
    """A server with the servicers ``register`` adds, answering on ``socket_path`` until the block
    ends; then its streams break, as when the daemon restarts."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    register(server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None).wait()
