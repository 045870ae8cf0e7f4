"""Events/s through the gRPC ingest gateway, per core of the gateway, unbatched and batched.

    python -m bench.gateway_throughput [--events N] [--unbatched N] [--clients C]

Starts a private platform and `gpulens gateway` as its own process (so its CPU time is its
own), pre-encodes StorageEvents (107 B) with unique event_ids, and streams them from C client
threads, each on its own connection and ``Stream`` call, in batches of 1, 100 and 500 events;
every batch is acked only after the broker acknowledged it. Prints wall-clock events/s and
events per CPU-second of the gateway process. Broker, gateway and clients share the machine's
cores. Then reads the topic back and counts by event_id (every event exactly once).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port, private_platform
from gpulens.protos.gateway.v1 import ingest_pb2, ingest_pb2_grpc
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.topics import STORAGE
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.gateway_support import event_ids, storage_event, storage_values

TOKEN = "bench-token"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _batches(codec: AvroCodec, name: str, events: int, size: int) -> list[ingest_pb2.EventBatch]:
    values = storage_values(f"vol-{name}")
    key, _ = storage_event(codec, STORAGE, name, volume=f"vol-{name}")
    out = []
    for start in range(0, events, size):
        batch = ingest_pb2.EventBatch(batch_id=f"{name}-{start}")
        for i in range(start, min(start + size, events)):
            value = codec.encode_dict(STORAGE, {**values, "event_id": f"{name}-{i}"})
            batch.events.add(topic=STORAGE.name, key=key, value=value)
        out.append(batch)
    return out


def _stream(port: int, batches: list[ingest_pb2.EventBatch], acked: list[int]) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        answers = stub.Stream(iter(batches), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=600)
        acked.append(sum(ack.events for ack in answers))


def run(port: int, pid: int, codec: AvroCodec, label: str, events: int, size: int, clients: int) -> int:
    work = [_batches(codec, f"{label}{c}", events // clients, size) for c in range(clients)]
    acked: list[int] = []
    threads = [threading.Thread(target=_stream, args=(port, batches, acked)) for batches in work]
    cpu, start = _cpu_seconds(pid), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, used = time.perf_counter() - start, _cpu_seconds(pid) - cpu
    total = sum(acked)
    print(
        f"  {size:>4} events/message  {total:>9,} events  {wall:6.1f} s  {total / wall:>9,.0f} events/s"
        f"  gateway CPU {used:6.1f} s  {total / used:>9,.0f} events/s per gateway core",
        flush=True,
    )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events per batched run")
    parser.add_argument("--unbatched", type=int, default=20_000, help="events of the unbatched run")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client streams")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        port = free_port()
        services = ServiceManager(Path(tmp) / "gateway")
        argv = [sys.executable, "-m", "gpulens", "--config", str(Path(tmp) / "gpulens.toml"), "gateway"]
        env = {
            "GPULENS_GATEWAY__PORT": str(port),
            "GPULENS_GATEWAY__TOKENS": f'["{TOKEN}"]',
            "GPULENS_GATEWAY__METRICS_PORT": "0",
        }
        status, _ = services.start(ServiceSpec("gateway", argv, "127.0.0.1", port, env=env))
        assert status.pid is not None
        try:
            print(f"gateway pid {status.pid} on port {port}, {args.clients} clients, StorageEvent 107 B")
            total = run(port, status.pid, codec, "u", args.unbatched, 1, args.clients)
            for size in (100, 500):
                total += run(port, status.pid, codec, f"b{size}-", args.events, size, args.clients)
        finally:
            services.stop("gateway")
        start = time.perf_counter()
        seen = event_ids(settings.kafka, codec, STORAGE, timeout=600)
        print(
            f"read back {len(seen):,} distinct event_ids of {total:,} sent in "
            f"{time.perf_counter() - start:.1f} s; published more than once: "
            f"{sum(1 for n in seen.values() if n > 1)}"
        )


if __name__ == "__main__":
    main()
