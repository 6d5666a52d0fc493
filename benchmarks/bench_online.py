"""Online training: source throughput, trainer throughput and model freshness.

1. source alone: events/s a stream delivers as Batches (DirectoryStream; KafkaStream too with
   ``--kafka``, on a Tansu broker started here);
2. trainer: events/s `RecModel.online_train` consumes AND trains (Wide&Deep) from that source;
   the goal is that the trainer, not the source, is the bottleneck (source >= 3x trainer);
3. freshness: `recstream produce` writes events at ``--rate`` into a directory (files flushed every
   0.5 s) while the trainer runs with a `ModelPublisher` every 5 s; an event's lag is the publish
   time of the first version trained on it minus its event time. Reports p50 / p99.

    python benchmarks/bench_online.py --events 200000 --rate 3000 --seconds 40
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time

import numpy as np
import torch

from recstream import RecModel
from recstream.callbacks import Callback
from recstream.cli.main import build_parser
from recstream.data import SyntheticCTR
from recstream.data.streams import DirectoryStream
from recstream.models import WideDeep, default_optimizer
from recstream.serving import ModelPublisher
from recstream.serving.server.freshness import event_freshness

DENSE, CATEGORICAL = 13, 26


def produce(target: list[str], rows: int, rate: float = 0.0, flush: float | None = None) -> None:
    args = build_parser().parse_args(["produce", "--synthetic", "--rows", str(rows), "--format", "csv",
                                      "--num-dense", str(DENSE), "--num-categorical", str(CATEGORICAL),
                                      "--rate", str(rate), *target,
                                      *(["--flush-interval", str(flush)] if flush else [])])
    from recstream.cli.produce import produce as run_produce
    run_produce(args)


class Meter(Callback):
    """Counts trained events; stops after `limit` events or `seconds`; keeps event times."""

    def __init__(self, limit=None, seconds=None):
        self.limit, self.seconds, self.events, self.event_times = limit, seconds, 0, []
        self.t_start = self.t_end = None

    def on_train_step_end(self, ctx):
        p = ctx.original_args()
        now = time.perf_counter()
        if self.t_start is None:  # timing starts after the first step (imports, first fill excluded)
            self.t_start = now
        else:
            self.events += len(p.train_dataset_element[1])
        for m in p.get("train_batch_metas") or ():
            if m.get("event_time") is not None:
                self.event_times.append(m["event_time"].numpy())
        self.t_end = now
        if (self.limit and self.events >= self.limit) or (self.seconds and now - self.t_start >= self.seconds):
            ctx.request_stop()

    def rate(self) -> float:
        return self.events / (self.t_end - self.t_start)


def source_rate(make_stream, events: int, batch_size: int) -> float:
    with make_stream() as stream:
        it = iter(stream)
        next(it)
        start, n = time.perf_counter(), 0
        while n < events:
            n += len(next(it)[1])
        return n / (time.perf_counter() - start)


def trainer_rate(make_stream, events: int, schema) -> float:
    net = WideDeep(schema, hidden=(256, 128))
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
    meter = Meter(limit=events)
    with make_stream() as stream:
        model.online_train(stream, callbacks=[meter], sink_size=1)
    return meter.rate()


def freshness(schema, rate: float, seconds: float, batch_size: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        incoming, published = f"{d}/in", f"{d}/models"
        producer = threading.Thread(target=produce, args=(["--directory", incoming, "--file-records", "1000000"],
                                                          int(rate * (seconds + 10)), rate, 0.5), daemon=True)
        producer.start()
        while not __import__("os").path.isdir(incoming):
            time.sleep(0.05)
        stream = DirectoryStream(incoming, schema, batch_size=batch_size, id_column="event_id",
                                 time_column="event_time", poll_interval=0.05)
        net = WideDeep(schema, hidden=(256, 128))
        model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
        publisher = ModelPublisher(published, schema=schema, every_seconds=5, keep=3)
        meter = Meter(seconds=seconds)
        model.online_train(stream, callbacks=[meter, publisher], sink_size=1)
        times = np.concatenate(meter.event_times)
        report = event_freshness(publisher.manifests, times)
        lags = report.lags[~np.isnan(report.lags)]
        return {"events": times.size, "covered": lags.size, "versions": len(publisher.manifests),
                "p50": float(np.percentile(lags, 50)), "p99": float(np.percentile(lags, 99))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--rate", type=float, default=3000.0, help="events/s produced in the freshness run")
    p.add_argument("--seconds", type=float, default=40.0, help="length of the freshness run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kafka", action="store_true", help="also measure KafkaStream on a local Tansu broker")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    schema = SyntheticCTR(DENSE, CATEGORICAL).schema
    rows = []
    with tempfile.TemporaryDirectory() as d:
        produce(["--directory", d, "--file-records", "50000"], args.events + 2 * args.batch_size)

        def make_dir_stream():
            return DirectoryStream(d, schema, batch_size=args.batch_size, id_column="event_id",
                                   time_column="event_time", idle_timeout=5)
        rows.append(("directory", source_rate(make_dir_stream, args.events - args.batch_size, args.batch_size),
                     trainer_rate(make_dir_stream, args.events - 4 * args.batch_size, schema)))
    if args.kafka:
        rows.append(kafka_rates(args, schema))
    print(f"Wide&Deep (256,128), {DENSE} dense + {CATEGORICAL} categorical, batch {args.batch_size}, "
          f"{args.threads} torch thread(s), {args.events} events")
    print(f"{'source':10} {'source ev/s':>12} {'trainer ev/s':>13} {'source/trainer':>15}")
    for name, src, trn in rows:
        print(f"{name:10} {src:12.0f} {trn:13.0f} {src / trn:15.1f}")
    f = freshness(schema, args.rate, args.seconds, args.batch_size)
    print(f"freshness at {args.rate:.0f} events/s, publisher every 5 s, {args.seconds:.0f} s: "
          f"p50 {f['p50']:.2f} s, p99 {f['p99']:.2f} s ({f['covered']}/{f['events']} events in "
          f"{f['versions']} versions)")


def kafka_rates(args, schema):
    from recstream.data.streams import KafkaStream
    from recstream.testing import TansuBroker
    broker = TansuBroker().start()
    try:
        produce(["--kafka", broker.bootstrap_servers, "--topic", "bench"], args.events + 2 * args.batch_size)

        def make_kafka_stream():
            return KafkaStream("bench", broker.bootstrap_servers, "bench", schema, batch_size=args.batch_size,
                               assignment=[("bench", 0)], id_column="event_id", time_column="event_time")
        return ("kafka", source_rate(make_kafka_stream, args.events - args.batch_size, args.batch_size),
                trainer_rate(make_kafka_stream, args.events - 4 * args.batch_size, schema))
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
