"""Fault injection over the whole online loop: producer -> Kafka -> trainer -> publisher -> server.

Runs, on this machine, with real processes:

- a local Kafka-protocol broker (Tansu) with a 3-partition topic and a dead-letter topic;
- a producer (this process) writing ``--events`` JSON events at ``--rate`` events/s, each with a
  unique ``event_id``, plus one poison record (five kinds, in turn) every ``--poison-every`` events;
- the trainer (`benchmarks/fault_worker.py`): `RecModel.online_train` on a `KafkaStream`, sink
  mode, a checkpoint every 10 steps, a `ModelPublisher` every second; its network counts, in its
  own state, how many times it trained on each event id;
- ``recstream serve`` on the publish directory, and a client thread posting one-instance
  ``/predict`` requests back to back.

Faults, on a schedule (``--faults`` picks some; all by default):

- ``freeze``: the broker frozen (SIGSTOP) for 4 s;
- ``kill``: the trainer SIGKILLed and restarted;
- ``corrupt-version``: a corrupt version planted in the publish directory;
- ``wipe``: the publish directory wiped (versions restart at 1);
- ``corrupt-checkpoint``: a corrupt newest checkpoint planted just before a SIGKILL and restart;
- ``frozen-commit``: a burst of events (the trainer checkpoints, so commits, while training it), then
  the broker frozen for ``--frozen-s`` s with a commit outstanding: the trainer's stream must notice
  it is idle (its ``idle_timeout``, 8 s) during the freeze instead of hanging behind the stuck commit;
- ``overflow``: a record whose dense value overflows float32 (``1e39``, with a real event id),
  which must be dead-lettered, not trained (it would make every weight NaN);
- ``torn-metrics``: the trainer SIGKILLed, half a row left at the end of its ``metrics.jsonl``,
  restarted: it must start and finish (``MetricsLog(append=True)`` reads the file back);
- ``stuck-version``: after training, a version numbered above the newest appears incomplete (the
  server tries it and fails), then becomes valid: the server must move to it.

A watcher checks every version the publisher writes for non-finite weights.

Report (and exit status 1 unless all are 0 / met): events lost and events trained twice (from the
trainer's final checkpoint), poison records not dead-lettered, requests failed after the first
answer (a 503 before any version exists is not a failure), versions published with non-finite
weights, the trainer's exit status, and each fault's own check (``checks``).

    python benchmarks/fault_injection.py --events 20000 --rate 1000
    python benchmarks/fault_injection.py --events 3000 --faults frozen-commit   # one fault, quickly
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from fault_worker import PARTITIONS, CountingNet  # noqa: E402

from recstream.callbacks import load_checkpoint  # noqa: E402
from recstream.serving.snapshot.layout import list_versions, manifest_digest, version_dirname  # noqa: E402
from recstream.testing import TansuBroker, free_port  # noqa: E402

POISON = [b'{"event_id": 1, "x1": ', b"\xff\xfe not utf-8", b"[" * 20000 + b"]" * 20000,
          b'{"event_id": "seven", "x1": 0.1, "x2": 0.2, "label": 1}', b'{"x1": 1e999, "x2": 0, "label": 1}']
# finite as float64, infinite as float32: trained, it turns every weight NaN; event 3 would also count twice
OVERFLOW = b'{"event_id": 3, "x1": 1e39, "x2": 0.5, "label": 1}'
FAULTS = ("freeze", "kill", "corrupt-version", "wipe", "corrupt-checkpoint", "frozen-commit", "overflow",
          "torn-metrics", "stuck-version")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]), OMP_NUM_THREADS="1")


class Trainer:
    """The trainer process, restartable; its output goes to a log file."""

    def __init__(self, args, broker, ckpt: Path, publish: Path, log: Path, run_dir: Path):
        self.cmd = [sys.executable, str(HERE / "fault_worker.py"), broker.bootstrap_servers, "clicks", "dead",
                    str(ckpt), str(publish), str(args.events), str(run_dir)]
        self.log, self.proc, self.starts = log, None, 0

    def start(self) -> None:
        self.starts += 1
        out = open(self.log, "a")
        out.write(f"--- start {self.starts}\n")
        out.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=_env())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class Client(threading.Thread):
    """Posts one-instance /predict requests back to back; counts answers and failures."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.stop = port, threading.Event()
        self.ok = self.failed = self.before_first = 0
        self.failures: list[str] = []
        self.version = None  # the version of the last answer

    def run(self) -> None:
        body = json.dumps({"instances": [{"event_id": 0, "x1": 0.5, "x2": -0.5}]})
        headers = {"Content-Type": "application/json"}
        conn = None
        while not self.stop.is_set():
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", "/predict", body, headers)
                resp = conn.getresponse()
                text = resp.read()
                if resp.status == 200:
                    self.ok += 1
                    self.version = json.loads(text).get("version")
                elif resp.status == 503 and self.ok == 0:
                    self.before_first += 1
                    time.sleep(0.05)
                else:
                    self._fail(f"{resp.status} {text[:120]!r}")
            except (OSError, http.client.HTTPException) as e:
                conn = None
                if self.ok:
                    self._fail(repr(e))
                else:
                    self.before_first += 1
                    time.sleep(0.05)

    def _fail(self, what: str) -> None:
        self.failed += 1
        if len(self.failures) < 5:
            self.failures.append(what)


def _produce(broker, args, schedule, faults, ctl: dict) -> int:
    """Events and poison records at the given rate; runs the fault `schedule` on the way. A fault
    may ask for a burst (``ctl["burst"]``: events sent at once, then ``ctl["after_burst"]()``)."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    rng = np.random.default_rng(0)
    start, poison, shift = time.monotonic(), 0, 0.0
    for i in range(args.events):
        x1, x2 = rng.standard_normal(2)
        record = {"event_id": i, "x1": round(float(x1), 4), "x2": round(float(x2), 4), "label": int(x1 + x2 > 0)}
        producer.produce("clicks", json.dumps(record).encode(), partition=i % PARTITIONS)
        if i % args.poison_every == args.poison_every - 1:
            producer.produce("clicks", ctl["poison"][poison % len(ctl["poison"])], partition=i % PARTITIONS)
            poison += 1
        # an armed burst runs alone: the faults due meanwhile wait until its freeze is over
        while schedule and not ctl.get("burst") and time.monotonic() - start - shift >= schedule[0][0]:
            _, name, action = schedule.pop(0)
            print(f"{time.monotonic() - start:6.1f} s  fault: {name}", flush=True)
            action()
            faults.append(name)
        if ctl.get("burst"):  # sent at once: no pacing
            ctl["burst"] -= 1
            if ctl["burst"] == 0 or i == args.events - 1:
                producer.flush(30)
                began = time.monotonic()
                ctl.pop("after_burst")()
                shift += time.monotonic() - began  # the schedule and the rate resume after the fault
            continue
        target = start + shift + (i + 1) / args.rate
        if target > time.monotonic():
            producer.poll(0)
            time.sleep(max(0.0, target - time.monotonic()))
    for _, name, action in schedule:  # faults the rate left for after the last event
        action()
        faults.append(name)
    producer.flush(30)
    return poison


def _dead_letters(broker, timeout: float = 10.0) -> tuple[int, int]:
    """(dead letters, distinct source records among them). Dead letters are at least once: a
    trainer killed after writing one and before its next checkpoint writes it again on re-reading."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "fault-count",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("dead", 0, 0)])
    letters, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        msgs = consumer.consume(1000, 0.5)
        letters += [json.loads(m.value()) for m in msgs if m.error() is None]
        if not msgs and letters:
            break
    consumer.close()
    return len(letters), len({json.dumps(letter["source"], sort_keys=True) for letter in letters})


def _plant_corrupt_checkpoint(ckpt: Path) -> None:
    """A garbage file that sorts and dates as the newest checkpoint (restore must skip it). Only
    beside a real checkpoint: with nothing valid to fall back on, restore refuses to start (it will
    not silently retrain from scratch), which is right but not this fault."""
    deadline = time.monotonic() + 30
    while not any(ckpt.glob("online*.safetensors")) and time.monotonic() < deadline:
        time.sleep(0.2)
    (ckpt / "online-zzz_corrupt.safetensors").write_bytes(os.urandom(4096))


def _plant_corrupt_version(publish: Path) -> None:
    versions = list_versions(publish)
    if versions:  # a version newer than any, with a manifest that is not JSON
        bad = publish / version_dirname(versions[-1] + 1000)
        bad.mkdir()
        (bad / "manifest.json").write_text("{not json")


def _plant_torn_metrics_line(run_dir: Path) -> None:
    """Half a row at the end of metrics.jsonl, as a kill in the middle of its write leaves it."""
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 99999, "trained": 12')


class VersionWatcher(threading.Thread):
    """Reads every version the publisher writes, once: counts those with non-finite weights."""

    def __init__(self, publish: Path):
        super().__init__(daemon=True)
        self.publish, self.stop = publish, threading.Event()
        self.seen: set[tuple[int, float]] = set()
        self.non_finite: list[int] = []

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.scan()

    def scan(self) -> None:
        from safetensors.torch import load_file
        for version in list_versions(self.publish):
            path = self.publish / version_dirname(version) / "model.safetensors"
            try:
                key = (version, path.stat().st_mtime)
                if key in self.seen:
                    continue
                tensors = load_file(str(path))
            except (OSError, ValueError, RuntimeError):  # not there (yet), removed, or a planted corrupt one
                continue
            self.seen.add(key)
            if any(t.is_floating_point() and not bool(t.isfinite().all()) for t in tensors.values()):
                self.non_finite.append(version)


def _stuck_version(publish: Path, client, settle: float = 3.0) -> dict:
    """A version above the newest appears incomplete (the server tries it and fails), then becomes
    valid (a copy of the newest under the new number, its manifest renumbered and re-digested):
    the server must move to it within `settle` s plus a few polls."""
    versions = [v for v in list_versions(publish) if (publish / version_dirname(v) / "manifest.json").exists()]
    if not versions:
        return {"served": False, "why": "no version to copy"}
    newest, stuck = versions[-1], versions[-1] + 1
    src, dst = publish / version_dirname(newest), publish / version_dirname(stuck)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("manifest.json"))  # an incomplete copy
    time.sleep(settle)  # the server polls (0.5 s): it tries the incomplete version and fails
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["version"] = stuck
    if manifest.get("kind") == "full":
        manifest["base"] = stuck
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (dst / ".manifest.tmp").write_text(json.dumps(manifest))
    os.replace(dst / ".manifest.tmp", dst / "manifest.json")  # now complete and valid
    deadline = time.monotonic() + settle + 5.0
    while time.monotonic() < deadline and client.version != stuck:
        time.sleep(0.1)
    return {"stuck_version": stuck, "served": client.version == stuck, "last_served": client.version}


def _idle_during(log: Path, windows: list[tuple[float, float]]) -> bool:
    """Whether the trainer printed an ``idle`` line inside each freeze window (epoch seconds)."""
    idles = [float(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("idle ")]
    return bool(windows) and all(any(a <= t <= b for t in idles) for a, b in windows)


def _wipe(publish: Path) -> None:
    for p in publish.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _final_counts(ckpt: Path, n_events: int) -> np.ndarray:
    files = sorted(ckpt.glob("*.safetensors"), key=os.path.getmtime)
    for path in reversed(files):  # the newest valid one (a planted corrupt file is skipped)
        net = CountingNet(n_events)
        try:
            load_checkpoint(path, net, restore_rng=False)
        except ValueError:
            continue
        return net.trained.numpy()
    raise RuntimeError(f"no valid checkpoint in {ckpt}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--rate", type=float, default=1000.0, help="events per second produced")
    p.add_argument("--poison-every", type=int, default=500)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the trainer to finish")
    p.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS), help="the faults to inject (all)")
    p.add_argument("--frozen-s", type=float, default=20.0, help="seconds the frozen-commit fault holds the broker")
    p.add_argument("--burst", type=int, default=10_000,
                   help="events the frozen-commit fault sends at once before the freeze (more than the trainer "
                        "trains in a second, so that it checkpoints and commits into the freeze)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="recstream-faults-"))
    ckpt, publish, run_dir, log = work / "ckpt", work / "publish", work / "run", work / "trainer.log"
    ckpt.mkdir(), publish.mkdir(), run_dir.mkdir()
    length = args.events / args.rate
    checks: dict = {}
    with TansuBroker() as broker:
        broker.create_topic("clicks", partitions=PARTITIONS)
        broker.create_topic("dead", partitions=1)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "recstream.cli.main", "serve", str(publish), "--port",
                                   str(port), "--model-factory", "fault_worker:make_net", "--poll-seconds", "0.5",
                                   "--torch-threads", "1", "--log-level", "WARNING"],
                                  stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "w"), env=_env())
        trainer = Trainer(args, broker, ckpt, publish, log, run_dir)
        trainer.start()
        client = Client(port)
        client.start()
        watcher = VersionWatcher(publish)
        watcher.start()
        ctl: dict = {"poison": POISON + ([OVERFLOW] if "overflow" in args.faults else [])}
        freeze_windows: list[tuple[float, float]] = []

        def kill_restart():
            trainer.kill()
            trainer.start()

        def freeze(seconds=4.0):
            broker.pause()
            try:
                time.sleep(seconds)
            finally:
                broker.resume()

        def corrupt_then_kill():
            _plant_corrupt_checkpoint(ckpt)
            kill_restart()

        def frozen_commit():  # after the burst: the trainer trains it, checkpoints and commits into the freeze
            deadline = time.monotonic() + 120
            while not any(ckpt.glob("online*.safetensors")) and time.monotonic() < deadline:
                time.sleep(0.2)  # the trainer is up and committing: its checkpoints are there

            def after_burst():
                time.sleep(0.5)  # the trainer fetches the burst, then trains it while the broker is frozen
                began = time.time()
                freeze(args.frozen_s)
                freeze_windows.append((began, time.time()))
            ctl["burst"], ctl["after_burst"] = max(1, min(args.burst, args.events)), after_burst

        def torn_metrics():
            trainer.kill()
            _plant_torn_metrics_line(run_dir)
            trainer.start()

        actions = {"freeze": (0.20, "broker frozen 4 s", freeze),
                   "frozen-commit": (0.25, f"burst of {args.burst}, then broker frozen {args.frozen_s:g} s with a "
                                           "commit outstanding", frozen_commit),
                   "kill": (0.35, "trainer SIGKILL + restart", kill_restart),
                   "torn-metrics": (0.45, "trainer SIGKILL + torn metrics.jsonl line + restart", torn_metrics),
                   "corrupt-version": (0.50, "corrupt version planted", lambda: _plant_corrupt_version(publish)),
                   "wipe": (0.60, "publish directory wiped", lambda: _wipe(publish)),
                   "corrupt-checkpoint": (0.75, "corrupt checkpoint + SIGKILL + restart", corrupt_then_kill)}
        schedule = [(at * length, name, action) for key, (at, name, action) in actions.items() if key in args.faults]
        schedule.sort(key=lambda entry: entry[0])
        faults: list[str] = ["float-overflow record among the poison"] if "overflow" in args.faults else []
        poison = _produce(broker, args, schedule, faults, ctl)
        try:
            trainer.proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            trainer.kill()
            print(f"trainer did not finish in {args.timeout} s; see {log}", flush=True)
        trainer_exit = trainer.proc.returncode
        time.sleep(2.0)  # the last versions reach the server
        if "stuck-version" in args.faults:
            faults.append("version failed once, then valid")
            checks["stuck_version"] = _stuck_version(publish, client)
        client.stop.set()
        client.join(15)
        watcher.stop.set()
        watcher.join(15)
        watcher.scan()
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        dead, distinct = _dead_letters(broker)
    if "frozen-commit" in args.faults:
        text = log.read_text()
        checks["frozen_commit"] = {
            "commit_outstanding": "no answer from the broker within commit_timeout" in text,
            "idle_noticed_during_freeze": _idle_during(log, freeze_windows)}
    if "torn-metrics" in args.faults:
        checks["torn_metrics"] = {"restarted_and_finished": trainer_exit == 0}
    counts = _final_counts(ckpt, args.events)
    report = {"events": args.events, "faults": faults, "trainer_starts": trainer.starts, "trainer_exit": trainer_exit,
              "events_lost": int((counts == 0).sum()), "events_trained_twice": int((counts > 1).sum()),
              "poison_records": poison, "poison_not_dead_lettered": poison - distinct,
              "dead_letters_written_again_after_a_kill": dead - distinct,
              "versions_checked": len(watcher.seen), "non_finite_versions_published": len(watcher.non_finite),
              "requests_ok": client.ok, "requests_failed": client.failed,
              "requests_before_first_version": client.before_first, "failures": client.failures,
              "checks": checks, "work_dir": str(work)}
    print(json.dumps(report, indent=1))
    failed_checks = [name for name, c in checks.items()
                     if not all(v for k, v in c.items() if isinstance(v, bool))]
    bad = report["events_lost"] or report["events_trained_twice"] or report["poison_not_dead_lettered"] \
        or report["requests_failed"] or report["non_finite_versions_published"] or trainer_exit != 0 or failed_checks
    print(f"FAILED {failed_checks or ''}" if bad else
          "all zero: no event lost or trained twice, every poison record dead-lettered, no non-finite version "
          "published, no request failed, every fault's check met")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
