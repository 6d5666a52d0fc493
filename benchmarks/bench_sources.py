"""Events per second that the stream sources deliver as Batches (no training), Criteo-like rows.

Rows are SyntheticCTR events in Criteo TSV form (label, 13 counts, 26 hex ids, plus event id
and event time: ~270 bytes a line), decoded with ``CriteoTSVDecoder`` (ids hashed into 100k
buckets) into Batches of 1024. Measured, each as the median of ``--repeats`` runs:

- ``decode``: ``CriteoTSVDecoder.decode`` of 1024-record lists alone (the CPU floor);
- ``directory``: ``DirectoryStream`` over files of 50k lines already on disk;
- ``kafka-1p`` / ``kafka-4p``: ``KafkaStream`` (explicit assignment) reading a topic of a
  local Tansu broker (in-memory storage, 127.0.0.1), 1 and 4 partitions, produced beforehand.

    python benchmarks/bench_sources.py --rows 200000 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from recstream.cli.producers import DirectoryWriter, format_records
from recstream.data import SyntheticCTR
from recstream.data.streams import CriteoTSVDecoder, DirectoryStream, KafkaStream
from recstream.testing import TansuBroker

BATCH = 1024


def criteo_records(n: int) -> list[bytes]:
    gen = SyntheticCTR(batch_size=min(n, 65536))  # 13 dense, 26 categorical: Criteo's shape
    out: list[bytes] = []
    for i, (features, labels) in enumerate(gen.train_batches((n + gen.batch_size - 1) // gen.batch_size)):
        ids = features.values.view(26, features.batch_size).T.numpy()
        start = i * gen.batch_size
        out += format_records("criteo", labels.numpy(), features.dense.numpy() * 10, ids,
                              event_ids=np.arange(start, start + features.batch_size),
                              times=np.full(features.batch_size, time.time()))
    return out[:n]


def decoder() -> CriteoTSVDecoder:
    return CriteoTSVDecoder(100_000, id_column="event_id", time_column="event_time")


def drain(stream, n: int) -> float:
    """Seconds to get n rows as Batches out of `stream`."""
    start, rows = time.perf_counter(), 0
    for batch in stream:
        rows += batch.batch_size
        if rows >= n:
            break
    if rows < n:
        raise RuntimeError(f"{type(stream).__name__} delivered {rows} rows, expected {n}")
    return time.perf_counter() - start


def bench_decode(records, repeats: int) -> list[float]:
    d, n = decoder(), len(records) - len(records) % BATCH
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for lo in range(0, n, BATCH):
            d.decode(records[lo:lo + BATCH])
        out.append(time.perf_counter() - start)
    return out


def bench_directory(records, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        with DirectoryWriter(tmp, "tsv", file_records=50_000) as writer:
            writer.write(records)
        n = len(records) - len(records) % BATCH
        return [drain(DirectoryStream(tmp, batch_size=BATCH, format="criteo", decoder=decoder(), idle_timeout=5), n)
                for _ in range(repeats)]


def bench_kafka(records, repeats: int, partitions: int) -> tuple[list[float], float]:
    with TansuBroker() as broker:
        broker.create_topic("bench", partitions)
        start = time.perf_counter()
        for p in range(partitions):
            broker.produce("bench", records[p::partitions], partition=p)
        produce_s = time.perf_counter() - start
        n = len(records) - len(records) % BATCH
        times = []
        for r in range(repeats):
            with KafkaStream("bench", broker.bootstrap_servers, f"bench-{r}", batch_size=BATCH, decoder=decoder(),
                             assignment=[("bench", p) for p in range(partitions)], idle_timeout=10) as s:
                times.append(drain(s, n))
        return times, produce_s


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    records = criteo_records(args.rows)
    n = args.rows - args.rows % BATCH
    mean_bytes = sum(map(len, records[:1000])) / 1000
    print(f"{args.rows} Criteo-like rows (~{mean_bytes:.0f} bytes each), batches of {BATCH}, "
          f"median of {args.repeats}, {os.cpu_count()} cpu(s)")
    results = [("decode (CriteoTSVDecoder only)", bench_decode(records, args.repeats), "")]
    results.append(("DirectoryStream (files on disk)", bench_directory(records, args.repeats), ""))
    for p in (1, 4):
        times, produce_s = bench_kafka(records, args.repeats, p)
        results.append((f"KafkaStream, {p} partition(s)", times, f"produced at {len(records) / produce_s:,.0f}/s"))
    print(f"{'source':34s} {'events/s':>12s} {'ms/batch':>9s}  note")
    for name, times, note in results:
        t = statistics.median(times)
        print(f"{name:34s} {n / t:12,.0f} {1000 * t / (n / BATCH):9.2f}  {note}")


if __name__ == "__main__":
    main()
