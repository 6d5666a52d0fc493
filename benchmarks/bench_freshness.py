"""Served-model freshness, end to end with real processes: how old is what `recstream serve` serves?

Four processes, as a deployment runs them:

1. `recstream produce --synthetic --rate R` writes events (each with its send time as ``event_time``)
   into a directory (files made visible every ``--flush-interval`` seconds) or a Kafka topic (the
   in-memory Tansu broker of `recstream.testing`);
2. `recstream online CONFIG.yaml` trains Wide&Deep on them and publishes versions (``publish:``);
3. `recstream serve DIR` hot-swaps the versions in;
4. this script polls ``GET /version`` every ``--sample`` seconds: the served model's **staleness** at
   each sample is ``now - max_event_time`` of the served version (the newest event it trained on).

Staleness is split into its stages, per served version (medians over the versions):

* ``event->taken``: from the version's newest event to the moment the publisher took the weights
  (the producer's file flush or Kafka delivery, the stream's poll and batching, the training step,
  the wait for the publish to fall due);
* ``taken->visible``: writing the version (serialize, fsync, checksums, rename: manifest ``created``);
* ``visible->served``: the server noticing it (its poll) and loading it (``loaded_at``), of which
  ``load`` is the load itself (read, verify, rebuild: ``load_seconds`` of ``GET /version``);
* the rest of a sample's staleness is the served version's age until the next swap (about half the
  interval between swaps on average).

The figures of a busy machine are pessimistic (processes wait for a core): the report prints the
load average. ``--quick`` is a short smoke run (tests run it; its figures are not a measurement).

    python benchmarks/bench_freshness.py                 # directory and Kafka, 60 s each, 2,000 events/s
    python benchmarks/bench_freshness.py --source directory --seconds 30 --publish-seconds 5
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

from recstream.cli.errors import EXIT_TERMINATED

DENSE, CATEGORICAL = 4, 6
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

# SyntheticCTR(4, 6)'s columns (what `recstream produce --synthetic --num-dense 4 --num-categorical 6`
# writes); the two large features are dynamic (HashEmbedding): versions between full ones are deltas.
CONFIG = """run_dir: {run_dir}
schema:
  dense: [I1, I2, I3, I4]
  categorical:
    - {{name: C1, vocab_size: 100, embedding_dim: 16}}
    - {{name: C2, vocab_size: 1000, embedding_dim: 16}}
    - {{name: C3, dynamic: true, capacity: 20000, embedding_dim: 16}}
    - {{name: C4, dynamic: true, capacity: 200000, embedding_dim: 16}}
    - {{name: C5, vocab_size: 100, embedding_dim: 16}}
    - {{name: C6, vocab_size: 1000, embedding_dim: 16}}
stream:
{source}
  batch_size: {batch_size}
{max_delay}  id_column: event_id
  time_column: event_time
model:
  type: widedeep
  hidden: [64, 32]
train:
  sink_mode: true
  sink_size: 1
  threads: 1
callbacks:
  checkpoint:
    every_seconds: {checkpoint_seconds}
    keep: 2
publish:
{publish}  keep: 5
"""


def recstream(*argv: str, cwd: str, log: str) -> subprocess.Popen:
    out = open(log, "w")  # noqa: SIM115 - closed with the process (the child holds it)
    return subprocess.Popen([sys.executable, "-m", "recstream", *argv], stdout=out, stderr=subprocess.STDOUT,
                            env=ENV, cwd=cwd)


def get_json(url: str, timeout: float = 2.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


class Poller(threading.Thread):
    """Asks the server for ``/version`` every `period` seconds; keeps (time, served version info)."""

    def __init__(self, port: int, period: float):
        super().__init__(daemon=True)
        self.url, self.period = f"http://127.0.0.1:{port}/version", period
        self.samples: list[tuple[float, dict]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period):
            info = get_json(self.url)
            if info is not None and info.get("max_event_time") is not None:
                self.samples.append((time.time(), info))


def config_text(args, run_dir: str, source: str) -> str:
    publish = "" if args.publish_seconds is None else f"  every_seconds: {args.publish_seconds}\n"
    max_delay = "" if args.max_delay is None else f"  max_delay: {args.max_delay}\n"
    return CONFIG.format(run_dir=run_dir, source=source, batch_size=args.batch_size, max_delay=max_delay,
                         checkpoint_seconds=args.checkpoint_seconds, publish=publish)


def run_chain(args, source: str, work: str) -> dict:
    """One run of the four processes; the staleness samples of its steady state, summarized."""
    from recstream.testing import free_port
    incoming, run_dir = os.path.join(work, "events"), os.path.join(work, "run")
    published = os.path.join(run_dir, "published")
    os.makedirs(incoming, exist_ok=True)
    os.makedirs(published, exist_ok=True)  # serve needs it (503 until the first version)
    broker = None
    produce = ["produce", "--synthetic", "--num-dense", str(DENSE), "--num-categorical", str(CATEGORICAL),
               "--rate", str(args.rate)]
    if source == "kafka":
        from recstream.testing import TansuBroker
        broker = TansuBroker().start()
        broker.create_topic("clicks", partitions=1)
        src = (f"  kafka: {{topics: [clicks], bootstrap_servers: '{broker.bootstrap_servers}', group_id: bench, "
               "partitions: [0]}")
        produce += ["--kafka", broker.bootstrap_servers, "--topic", "clicks"]
    else:
        src = f"  directory: {{path: {incoming}, format: csv, poll_interval: {args.dir_poll}}}"
        produce += ["--directory", incoming, "--flush-interval", str(args.flush_interval),
                    "--file-records", "1000000"]
    with open(os.path.join(work, "c.yaml"), "w") as f:
        f.write(config_text(args, run_dir, src))
    port = free_port()
    procs = {}
    try:
        procs["serve"] = recstream("serve", published, "--port", str(port),
                                   *(["--poll-seconds", str(args.poll_seconds)] if args.poll_seconds else []),
                                   cwd=work, log=os.path.join(work, "serve.log"))
        procs["online"] = recstream("online", "c.yaml", "--json", cwd=work, log=os.path.join(work, "online.log"))
        # events until the first version is served (a version falls due at a step end: steps must go on
        # until one does); then the measured producer starts
        procs["prime"] = recstream(*produce, "--rows", "0", "--seed", "1", cwd=work,
                                   log=os.path.join(work, "prime.log"))
        poller = Poller(port, args.sample)
        poller.start()
        deadline = time.time() + args.start_timeout
        while not poller.samples:  # start-up (imports, the first version) is not measured
            dead = [name for name, proc in procs.items() if proc.poll() is not None]
            if dead or time.time() > deadline:
                raise RuntimeError(f"{source}: no version served after {args.start_timeout:.0f} s "
                                   f"(exited: {dead})\n" + tail_logs(work, procs))
            time.sleep(0.1)
        procs["prime"].send_signal(signal.SIGTERM)  # it stops cleanly (its files complete)
        procs["prime"].wait(timeout=60)  # (two writers must not share a directory)
        rows = int(args.rate * (args.warmup + args.seconds))
        procs["produce"] = recstream(*produce, "--rows", str(rows), "--seed", "2", "--id-start", "1000000000",
                                     cwd=work, log=os.path.join(work, "produce.log"))
        produce_rc = procs["produce"].wait(timeout=args.warmup + args.seconds + args.start_timeout)
        end = time.time()  # the last `seconds` before the producer's end are steady production
        time.sleep(1.0)
        poller.stop.set()
        poller.join()
        procs["online"].send_signal(signal.SIGTERM)  # a clean stop: final checkpoint, its JSON line
        online_rc = procs["online"].wait(timeout=120)
        if produce_rc or online_rc not in (0, EXIT_TERMINATED):
            raise RuntimeError(f"{source}: produce exited {produce_rc}, online {online_rc}\n" + tail_logs(work, procs))
        result = json.loads([line for line in read(work, "online").splitlines() if line.startswith("{")][-1])
        # the producer's own rate (its last line: "... in S s (R events/s) ..."), not counting its start
        rate = re.search(r"\(([\d,.]+) events/s\)", read(work, "produce"))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        if broker is not None:
            broker.stop()
    return summarize(source, poller.samples, end - args.seconds, end, rows,
                     float(rate.group(1).replace(",", "")) if rate else None, result)


def read(work: str, name: str) -> str:
    with open(os.path.join(work, f"{name}.log")) as f:
        return f.read()


def tail_logs(work: str, procs) -> str:
    return "\n".join(f"--- {name}\n{read(work, name)[-3000:]}" for name in procs)


def summarize(source: str, samples, start: float, end: float, rows: int | None, rate: float | None,
              result: dict) -> dict:
    """Staleness quantiles of the samples taken in [start, end] (steady state), and the stages."""
    steady = [(t, info) for t, info in samples if start <= t <= end]
    stale = np.array([t - info["max_event_time"] for t, info in steady])
    versions = {info["version"]: info for _, info in steady}
    out = {"source": source, "events": rows, "events_per_s": rate, "samples": int(stale.size),
           "versions_served": len(versions),
           "trained": (result.get("metrics") or {}).get("events") or result.get("steps"),
           "load_average": os.getloadavg()}
    for q in (50, 95, 99):
        out[f"p{q}"] = float(np.percentile(stale, q)) if stale.size else None
    out["max"] = float(stale.max()) if stale.size else None
    infos = sorted(versions.values(), key=lambda i: i["version"])

    def median(values):
        values = [v for v in values if v is not None]
        return float(np.median(values)) if values else None
    out["versions"] = [{k: i.get(k) for k in ("version", "kind", "step", "checkpoint_step", "max_event_time", "taken",
                                              "created", "loaded_at", "load_seconds")} for i in infos]
    out["stages"] = {
        "event->taken": median([i.get("taken") and i["taken"] - i["max_event_time"] for i in infos]),
        "taken->visible": median([i.get("taken") and i["created"] - i["taken"] for i in infos]),
        "visible->served": median([i["loaded_at"] - i["created"] for i in infos]),
        "load": median([i.get("load_seconds") for i in infos]),
        "swap interval": median(np.diff([i["loaded_at"] for i in infos]).tolist()) if len(infos) > 1 else None,
        "full/delta": f"{sum(i['kind'] == 'full' for i in infos)}/{sum(i['kind'] == 'delta' for i in infos)}",
    }
    return out


def report(r: dict) -> str:
    def s(v):
        return "-" if v is None else f"{v:.2f}"
    st = r["stages"]
    return (f"{r['source']:9} {r['events_per_s'] or 0:5.0f} ev/s produced  staleness p50 {s(r['p50'])} s  "
            f"p95 {s(r['p95'])} s  "
            f"p99 {s(r['p99'])} s  max {s(r['max'])} s  ({r['samples']} samples, {r['versions_served']} versions "
            f"served, full/delta {st['full/delta']})\n"
            f"          stages (medians): event->taken {s(st['event->taken'])} s, taken->visible "
            f"{s(st['taken->visible'])} s, visible->served {s(st['visible->served'])} s (load {s(st['load'])} s), "
            f"swap interval "
            f"{s(st['swap interval'])} s; load average {', '.join(f'{x:.2f}' for x in r['load_average'])}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", choices=["directory", "kafka", "both"], default="both")
    p.add_argument("--rate", type=float, default=2000.0, help="events/s produced")
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds (after --warmup)")
    p.add_argument("--warmup", type=float, default=10.0,
                   help="seconds of the measured producer not measured (its start, the backlog's drain)")
    p.add_argument("--start-timeout", type=float, default=180.0, help="seconds allowed until a version is served")
    p.add_argument("--sample", type=float, default=0.05, help="seconds between /version samples")
    p.add_argument("--batch-size", type=int, default=1024, help="stream.batch_size")
    p.add_argument("--max-delay", type=float, default=None, help="stream.max_delay (default: the CLI's)")
    p.add_argument("--publish-seconds", type=float, default=None,
                   help="publish.every_seconds (default: the CLI's)")
    p.add_argument("--poll-seconds", type=float, default=None, help="recstream serve --poll-seconds "
                   "(default: the CLI's)")
    p.add_argument("--checkpoint-seconds", type=int, default=10, help="callbacks.checkpoint.every_seconds")
    p.add_argument("--flush-interval", type=float, default=0.1,
                   help="the producer makes its directory file visible this often")
    p.add_argument("--dir-poll", type=float, default=0.05, help="stream.directory.poll_interval")
    p.add_argument("--quick", action="store_true", help="a short smoke run (not a measurement)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON line")
    p.add_argument("--trace", default=None, help="write the results with every served version's times here "
                   "(JSON), to attribute a tail to its stage")
    return p


def main(argv=None) -> list[dict]:
    args = parser().parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.rate, args.batch_size = 5.0, 3.0, 500.0, 128
    sources = ["directory", "kafka"] if args.source == "both" else [args.source]
    results = []
    for source in sources:
        with tempfile.TemporaryDirectory(prefix=f"fresh-{source}-") as work:
            results.append(run_chain(args, source, work))
    if args.trace:
        with open(args.trace, "w") as f:
            json.dump(results, f, indent=1)
    for r in results:
        r.pop("versions")
    if args.json:
        print(json.dumps(results))
    else:
        print(f"served-model staleness (now - newest event the served version trained on), "
              f"{args.rate:.0f} events/s asked, the last {args.seconds:.0f} s of the producer measured")
        for r in results:
            print(report(r))
    return results


if __name__ == "__main__":
    main()
