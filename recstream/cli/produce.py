"""`recstream produce`: write events into a Kafka topic or a followed directory, at a chosen rate.

Events come from a file (CSV/TSV/JSON lines/Criteo TSV, one record per line) or from the
synthetic CTR generator (`recstream.data.SyntheticCTR`). Each record gets an event
id (consecutive from ``--id-start``) and the event time (epoch seconds when sent) as its
last two fields (``event_id``, ``event_time``; JSON: keys), which is what the streams'
``id_column`` / ``time_column`` read. For demos, tests and load runs::

    recstream produce --synthetic --rows 100000 --format criteo --kafka 127.0.0.1:9092 --topic clicks --rate 5000
    recstream produce --input day_0.tsv --input-format criteo --directory /data/incoming --file-records 50000

Consume synthetic CSV/JSON events with ``SyntheticCTR(num_dense, num_categorical).schema``;
Criteo-format ones with ``CriteoTSVDecoder(id_column="event_id", time_column="event_time")``.

Synthetic events have two seeds. ``--truth-seed`` (default 0) fixes the hidden ground truth,
the click model the events are drawn from: keep it, and every run draws from the same model,
so a model trained on one run's events scores another's. ``--seed`` picks the rows (batch
``i`` of a run is the generator's batch ``seed * 2**32 + i``); without it each run takes a new
one, so two runs do not repeat each other's events. The final line names both, so a run can
be repeated exactly.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import os
import secrets
import time
from collections.abc import Iterator

from .errors import EXIT_USAGE, CliError
from .options import checked

_OWNER = "recstream produce"
ROWS_SEEDS = 1 << 31  # --seed below this; batch i of a run is the generator's batch seed * ROWS_STRIDE + i
ROWS_STRIDE = 1 << 32
_EXT = {"csv": "csv", "tsv": "tsv", "jsonl": "jsonl", "criteo": "tsv", "parquet": "parquet"}
DESCRIPTION = """Write events into a Kafka topic or a followed directory, at a chosen rate.

Events come from a file (CSV/TSV/JSON lines/Criteo TSV, one record per line) or from the
synthetic CTR generator. Each record gets an event id and its send time as its last two
fields (event_id, event_time; JSON: keys). Synthetic rows are drawn from a hidden
ground truth fixed by --truth-seed (default 0); --seed picks the rows (default: new ones
each run; the final line names the seed to repeat them). Examples:

  recstream produce --synthetic --rows 100000 --format criteo --kafka 127.0.0.1:9092 --topic clicks --rate 5000
  recstream produce --input day_0.tsv --input-format criteo --directory /data/incoming --file-records 50000

Ctrl-C/SIGTERM stop it cleanly: records already written are published (no .tmp file is left)."""


def _checked(kind: type, name: str, **bounds):
    return checked(kind, _OWNER, name, **bounds)


def add_parser(sub) -> None:
    p = sub.add_parser("produce", help="write events (a file or synthetic CTR data) to Kafka or a directory",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="a file with one record per line")
    src.add_argument("--synthetic", action="store_true", help="generate SyntheticCTR events")
    p.add_argument("--input-format", choices=["csv", "tsv", "jsonl", "criteo"], default="csv",
                   help="format of --input lines (default csv)")
    p.add_argument("--header", action="store_true", help="--input starts with a header line (not sent)")
    p.add_argument("--format", choices=["csv", "jsonl", "criteo", "parquet"], default="csv",
                   help="record format of --synthetic events (criteo needs 13 dense and 26 categorical; "
                        "parquet: files with page checksums, with --directory)")
    p.add_argument("--num-dense", type=_checked(int, "--num-dense", minimum=0), default=13)
    p.add_argument("--num-categorical", type=_checked(int, "--num-categorical", minimum=0), default=26)
    p.add_argument("--seed", type=_checked(int, "--seed", minimum=0, maximum=ROWS_SEEDS - 1), default=None,
                   help="which synthetic rows (default: a new seed each run, printed at the end); the same seed "
                        "and truth seed repeat the same events")
    p.add_argument("--truth-seed", type=_checked(int, "--truth-seed", minimum=0), default=0,
                   help="the hidden ground truth (click model) the synthetic rows are drawn from (default 0: "
                        "every run draws from the same model)")
    p.add_argument("--rows", type=_checked(int, "--rows", minimum=0), default=None,
                   help="events to send (default: all of --input, 10000 synthetic; 0: synthetic forever)")
    dst = p.add_mutually_exclusive_group(required=True)
    dst.add_argument("--kafka", metavar="BOOTSTRAP", help="Kafka bootstrap servers, e.g. 127.0.0.1:9092")
    dst.add_argument("--directory", help="write files into this directory (atomic renames)")
    p.add_argument("--topic", help="Kafka topic (with --kafka)")
    p.add_argument("--partitions", type=_checked(int, "--partitions", minimum=1), default=1,
                   help="partitions if the topic has to be created")
    p.add_argument("--file-records", type=_checked(int, "--file-records", minimum=1), default=100_000,
                   help="records per file (with --directory)")
    p.add_argument("--row-group-records", type=_checked(int, "--row-group-records", minimum=1), default=10_000,
                   help="rows per Parquet row group (--format parquet): a corrupt page costs its row group")
    p.add_argument("--flush-interval", type=_checked(float, "--flush-interval", minimum=0), default=None,
                   help="publish a file after this many seconds even if not full (with --directory)")
    p.add_argument("--rate", type=_checked(float, "--rate", minimum=0), default=0.0,
                   help="events per second (0: as fast as possible)")
    p.add_argument("--id-start", type=_checked(int, "--id-start", minimum=0), default=0, help="first event id")
    p.add_argument("--no-meta", action="store_true", help="send records without event id / time fields")
    p.add_argument("--connect-timeout", type=_checked(float, "--connect-timeout", minimum=0, min_open=True),
                   default=10.0, help="seconds to wait for the Kafka broker before giving up (default 10)")
    p.set_defaults(run=run)


def _synthetic(args) -> Iterator[list[bytes]]:
    """Blocks of synthetic records (without meta fields)."""
    from ..data import SyntheticCTR
    from .producers import format_records
    gen = SyntheticCTR(args.num_dense, args.num_categorical, seed=args.truth_seed, batch_size=4096)
    names = list(gen.schema.columns)
    for i in itertools.count(args.seed * ROWS_STRIDE):  # the truth stays; the rows are the seed's own
        features, labels = next(iter(gen.train_batches(1, start=i)))
        ids = features.values.view(features.num_features, features.batch_size).T.numpy()
        if args.format == "parquet":  # columns, not records: the meta columns are added per chunk
            yield _Columns(labels.numpy(), features.dense.numpy(), ids, names)
        else:
            yield format_records(args.format, labels.numpy(), features.dense.numpy(), ids, names=names)


class _Columns:
    """A block of synthetic events as columns (for Parquet): sliced like a list of records."""

    def __init__(self, labels, dense, ids, names) -> None:
        self.labels, self.dense, self.ids, self.names = labels, dense, ids, names

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, s: slice) -> _Columns:
        return _Columns(self.labels[s], self.dense[s], self.ids[s], self.names)

    def table(self, event_ids=None, times=None):
        from .producers import records_table
        return records_table(self.labels, self.dense, self.ids, self.names, event_ids=event_ids, times=times)


def _lines(args) -> Iterator[list[bytes]]:
    """Blocks of the lines of --input (the header skipped, blank lines dropped)."""
    with open(args.input, "rb") as f:
        if args.header:
            f.readline()
        while True:
            block = f.readlines(1 << 20)
            if not block:
                return
            yield [ln.rstrip(b"\r\n") for ln in block if ln.strip()]


def _writer(args):
    """Where the events go: a DirectoryWriter or a KafkaWriter (the topic created if needed)."""
    from .producers import DirectoryWriter, KafkaWriter, ParquetDirectoryWriter
    if args.directory and args.synthetic and args.format == "parquet":
        return ParquetDirectoryWriter(args.directory, args.file_records, args.flush_interval, args.row_group_records)
    if args.directory:
        ext = _EXT[args.format if args.synthetic else args.input_format]
        return DirectoryWriter(args.directory, ext, args.file_records, args.flush_interval)
    try:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic
    except ModuleNotFoundError as e:
        raise CliError(f"--kafka needs the Kafka client: pip install 'recstream[kafka]' ({e})") from e
    # librdkafka logs every failed connection attempt to stderr; the one-line error below says it all
    quiet = logging.getLogger("recstream.produce.librdkafka")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    admin = AdminClient({"bootstrap.servers": args.kafka, "logger": quiet})
    try:  # a bounded wait for the broker, then make sure the topic exists
        admin.list_topics(timeout=args.connect_timeout)
    except KafkaException as e:
        raise CliError(f"cannot reach Kafka at {args.kafka} within {args.connect_timeout:g} s: "
                       f"{e.args[0].str()}") from None
    try:  # the asked partitions if the topic is new
        admin.create_topics([NewTopic(args.topic, num_partitions=args.partitions,
                                      replication_factor=1)])[args.topic].result(timeout=args.connect_timeout)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise CliError(f"cannot create topic {args.topic!r} at {args.kafka}: {e.args[0].str()}") from None
    return KafkaWriter(args.kafka, args.topic, {"logger": quiet})


def _check_args(args) -> None:
    """Mistakes found before anything is created (no output directory, no topic)."""
    if args.input is not None and not os.path.isfile(args.input):
        what = "is not a file" if os.path.exists(args.input) else "does not exist"
        raise CliError(f"--input {args.input} {what}", EXIT_USAGE)
    if args.synthetic and args.format == "criteo" and (args.num_dense, args.num_categorical) != (13, 26):
        raise CliError("--format criteo needs --num-dense 13 --num-categorical 26", EXIT_USAGE)
    if args.synthetic and args.format == "parquet" and not args.directory:
        raise CliError("--format parquet writes files: it needs --directory", EXIT_USAGE)
    if args.kafka and not args.topic:
        raise CliError("--kafka needs --topic", EXIT_USAGE)
    if args.directory and os.path.exists(args.directory) and not os.path.isdir(args.directory):
        raise CliError(f"--directory {args.directory} is not a directory", EXIT_USAGE)


def produce(args) -> tuple[int, float]:
    """Send the events; returns (events sent, seconds)."""
    import numpy as np

    from .producers import RateLimiter, append_meta
    _check_args(args)
    limit = args.rows if args.rows is not None else (10_000 if args.synthetic else None)
    fmt = args.format if args.synthetic else args.input_format
    blocks = _synthetic(args) if args.synthetic else _lines(args)
    limiter = RateLimiter(args.rate)
    next_id, sent = args.id_start, 0
    writer = _writer(args)
    start = time.monotonic()
    try:
        for block in blocks:
            for lo in range(0, len(block), limiter.chunk()):
                if limit and sent >= limit:
                    return sent, time.monotonic() - start
                chunk = block[lo:lo + min(limiter.chunk(), (limit - sent) if limit else len(block))]
                now = time.time()
                meta = (np.arange(next_id, next_id + len(chunk)), np.full(len(chunk), round(now, 6)))
                if isinstance(chunk, _Columns):  # Parquet: a table, with the meta columns unless --no-meta
                    chunk = chunk.table(*((None, None) if args.no_meta else meta))
                elif not args.no_meta:  # one send time per chunk (~10 ms at most when rate-limited)
                    chunk = append_meta(chunk, fmt, *meta)
                writer.write(chunk, [int(now * 1000)] * len(chunk))
                next_id += len(chunk)
                sent += len(chunk)
                limiter.wait(len(chunk))
        return sent, time.monotonic() - start
    finally:
        writer.close()


def run(args) -> int:
    if args.synthetic and args.seed is None:  # a new run, new rows (the same truth)
        args.seed = secrets.randbelow(ROWS_SEEDS)
    sent, seconds = produce(args)
    where = f"directory {args.directory}" if args.directory else f"topic {args.topic} at {args.kafka}"
    seeds = f", --seed {args.seed} --truth-seed {args.truth_seed}" if args.synthetic else ""
    print(f"recstream produce: {sent} events to {where} in {seconds:.2f} s "
          f"({sent / max(seconds, 1e-9):,.0f} events/s), ids {args.id_start}..{args.id_start + sent - 1}{seeds}")
    return 0
