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

Faults, on a schedule: the broker frozen (SIGSTOP) for 4 s; the trainer SIGKILLed and restarted
(twice); a corrupt newest checkpoint planted just before one restart; a corrupt version planted
in the publish directory; the publish directory wiped (versions restart at 1).

Report (and exit status 1 unless all are 0): events lost and events trained twice (from the
trainer's final checkpoint), poison records not dead-lettered, requests failed after the first
answer (a 503 before any version exists is not a failure).

    python benchmarks/fault_injection.py --events 20000 --rate 1000
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
from recstream.testing import TansuBroker, free_port  # noqa: E402

POISON = [b'{"event_id": 1, "x1": ', b"\xff\xfe not utf-8", b"[" * 20000 + b"]" * 20000,
          b'{"event_id": "seven", "x1": 0.1, "x2": 0.2, "label": 1}', b'{"x1": 1e999, "x2": 0, "label": 1}']


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]), OMP_NUM_THREADS="1")


class Trainer:
    """The trainer process, restartable; its output goes to a log file."""

    def __init__(self, args, broker, ckpt: Path, publish: Path, log: Path):
        self.cmd = [sys.executable, str(HERE / "fault_worker.py"), broker.bootstrap_servers, "clicks", "dead",
                    str(ckpt), str(publish), str(args.events)]
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


def _produce(broker, args, schedule, faults) -> int:
    """Events and poison records at the given rate; runs the fault `schedule` on the way."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    rng = np.random.default_rng(0)
    start, poison = time.monotonic(), 0
    for i in range(args.events):
        x1, x2 = rng.standard_normal(2)
        record = {"event_id": i, "x1": round(float(x1), 4), "x2": round(float(x2), 4), "label": int(x1 + x2 > 0)}
        producer.produce("clicks", json.dumps(record).encode(), partition=i % PARTITIONS)
        if i % args.poison_every == args.poison_every - 1:
            producer.produce("clicks", POISON[poison % len(POISON)], partition=i % PARTITIONS)
            poison += 1
        while schedule and time.monotonic() - start >= schedule[0][0]:
            _, name, action = schedule.pop(0)
            print(f"{time.monotonic() - start:6.1f} s  fault: {name}", flush=True)
            action()
            faults.append(name)
        target = start + (i + 1) / args.rate
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
    versions = sorted((p for p in publish.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if versions:  # a version newer than any, with a manifest that is not JSON
        bad = publish / str(int(versions[-1].name) + 1000)
        bad.mkdir()
        (bad / "manifest.json").write_text("{not json")


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
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="recstream-faults-"))
    ckpt, publish, log = work / "ckpt", work / "publish", work / "trainer.log"
    ckpt.mkdir(), publish.mkdir()
    length = args.events / args.rate
    with TansuBroker() as broker:
        broker.create_topic("clicks", partitions=PARTITIONS)
        broker.create_topic("dead", partitions=1)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "recstream.cli.main", "serve", str(publish), "--port",
                                   str(port), "--model-factory", "fault_worker:make_net", "--poll-seconds", "0.5",
                                   "--torch-threads", "1", "--log-level", "WARNING"],
                                  stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "w"), env=_env())
        trainer = Trainer(args, broker, ckpt, publish, log)
        trainer.start()
        client = Client(port)
        client.start()

        def kill_restart():
            trainer.kill()
            trainer.start()

        def freeze():
            broker.pause()
            time.sleep(4.0)
            broker.resume()

        def corrupt_then_kill():
            _plant_corrupt_checkpoint(ckpt)
            kill_restart()

        schedule = [(0.20 * length, "broker frozen 4 s", freeze),
                    (0.35 * length, "trainer SIGKILL + restart", kill_restart),
                    (0.50 * length, "corrupt version planted", lambda: _plant_corrupt_version(publish)),
                    (0.60 * length, "publish directory wiped", lambda: _wipe(publish)),
                    (0.75 * length, "corrupt checkpoint + SIGKILL + restart", corrupt_then_kill)]
        faults: list[str] = []
        poison = _produce(broker, args, schedule, faults)
        try:
            trainer.proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            trainer.kill()
            print(f"trainer did not finish in {args.timeout} s; see {log}", flush=True)
        time.sleep(2.0)  # the last versions reach the server
        client.stop.set()
        client.join(15)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        dead, distinct = _dead_letters(broker)
    counts = _final_counts(ckpt, args.events)
    report = {"events": args.events, "faults": faults, "trainer_starts": trainer.starts,
              "events_lost": int((counts == 0).sum()), "events_trained_twice": int((counts > 1).sum()),
              "poison_records": poison, "poison_not_dead_lettered": poison - distinct,
              "dead_letters_written_again_after_a_kill": dead - distinct,
              "requests_ok": client.ok, "requests_failed": client.failed,
              "requests_before_first_version": client.before_first, "failures": client.failures,
              "work_dir": str(work)}
    print(json.dumps(report, indent=1))
    bad = report["events_lost"] or report["events_trained_twice"] or report["poison_not_dead_lettered"] \
        or report["requests_failed"]
    print("FAILED" if bad else "all zero: no event lost or trained twice, every poison record dead-lettered, "
          "no request failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
