"""GPU sample batches decoded per CPU-microsecond, by fetch size: by column, one by one, bare fastavro.

    python -m bench.sample_decode [--nodes 1250] [--fetches 200,600,5000] [--repeat 5]

The worker reads the sample batches of a fetch by column
(:class:`~gpulens.schemas.wire.sample_columns.NativeSampleDecoder`), from 128 batches a fetch;
fewer go one by one through the generated reader (``AvroCodec.decode``). The baseline is the
bare library: ``fastavro.schemaless_reader`` on the body into dicts, no model, no validation.
The batches are ``gpulens simulate``'s (8 GPUs a node, every field of a sample present as the
simulator fills it), encoded with the registry's schema id. CPU time of this process, garbage
collection off during each measurement (the work alone), best of ``--repeat`` passes. A private
platform gives the registry. Prints, never asserts.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro

from gpulens.platform import private_platform
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec
from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.models import GpuSampleBatch
from gpulens.schemas.model.topics import GPU_SAMPLES
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.schemas.wire.sample_columns import NativeSampleDecoder


def fleet_values(codec: AvroCodec, nodes: int) -> list[bytes]:
    spec = SimulationSpec(
        nodes=nodes, gpus_per_node=8, interval_s=2.0, start=datetime(2025, 1, 1, tzinfo=UTC), duration_s=20
    )
    batches = [event for _, event in ClusterSimulation(spec).events() if isinstance(event, GpuSampleBatch)]
    return [codec.encode(GPU_SAMPLES, batch) for batch in batches]


Decode = Callable[[Sequence[bytes]], object]


def per_batch_us(decode: Decode, fetches: list[list[bytes]], repeat: int) -> float:
    """Best CPU microseconds per batch over ``repeat`` passes of every fetch."""
    decode(fetches[0])  # warm: schema lookups, compiled readers
    batches, best = sum(len(f) for f in fetches), float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            started = time.process_time()
            for fetch in fetches:
                decode(fetch)
            best = min(best, time.process_time() - started)
        finally:
            gc.enable()
    return best / batches * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250, help="Simulated nodes (8 GPUs), 20 s of them.")
    parser.add_argument("--fetches", default="200,600,5000", help="Comma-separated batches per fetch.")
    parser.add_argument("--repeat", type=int, default=5, help="Passes per measurement; the best is kept.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        codec = AvroCodec(registry_client(settings.registry.url))
        values = fleet_values(codec, args.nodes)
        columns = NativeSampleDecoder(codec, GPU_SAMPLES)
        schema = fastavro.parse_schema(json.loads(committed(GpuSampleBatch)))

        def bare(fetch: Sequence[bytes]) -> list[Any]:
            return [fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None) for value in fetch]

        ways: dict[str, Decode] = {
            "by column (worker, >= 128 a fetch)": columns.decode,
            "one by one (generated reader)": lambda fetch: [codec.decode(GPU_SAMPLES, v) for v in fetch],
            "baseline: fastavro into dicts": bare,
        }
        print(f"{len(values):,} batches of 8 GPUs; CPU us per batch, best of {args.repeat}")
        sizes = [int(size) for size in args.fetches.split(",")]
        print(f"{'batches a fetch':<36}" + "".join(f"{size:>10,}" for size in sizes))
        for name, decode in ways.items():
            cells = []
            for size in sizes:
                fetches = [values[i : i + size] for i in range(0, len(values) - size + 1, size)]
                cells.append(f"{per_batch_us(decode, fetches, args.repeat):>10.2f}")
            print(f"{name:<36}" + "".join(cells))


if __name__ == "__main__":
    main()
