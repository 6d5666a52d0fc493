"""RecModel.online_train on 2 gloo ranks (torchrun): each rank reads its own files or partitions,
the ranks stay in step with uneven data, stop together, and every event is trained exactly once,
across a SIGKILL of one rank and a restart of the job too."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("online_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def write_files(data: Path, sizes: list[int], first_id: int = 1) -> list[tuple[str, list[int]]]:
    """Files of `sizes` events each (ids from `first_id` on); returns (name, ids) per file."""
    rng = np.random.default_rng(len(sizes))
    data.mkdir(parents=True, exist_ok=True)
    files, next_id = [], first_id
    for f, n in enumerate(sizes):
        ids = list(range(next_id, next_id + n))
        next_id += n
        x = rng.standard_normal((n, 2))
        c = rng.integers(0, 50, n)
        lines = "".join(f"{int(a > 0)},{i},{a:.4f},{b:.4f},{k}\n" for i, (a, b), k in zip(ids, x, c, strict=True))
        name = f"part-{f:04d}.csv"
        tmp = data / f".{name}.tmp"
        tmp.write_text(lines)
        os.rename(tmp, data / name)
        files.append((name, ids))
    return files


def owner(name: str, world_size: int = 2) -> int:
    """The rule of DirectoryStream, written out here independently."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % world_size


def torchrun(cfg: dict, ranks: int = 2, restarts: int = 0, **popen) -> subprocess.Popen:
    # an elastic restart must not find the previous attempt's process-group addresses in the agent's
    # store (subgroups would connect to the dead workers): each attempt's rank 0 hosts a fresh one
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
           f"--max-restarts={restarts}", str(WORKER), json.dumps(cfg)]
    return subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL a job that is still running: torchrun and its workers (which it starts in sessions
    of their own, so they are found as its children)."""
    if proc.poll() is not None:
        return
    for pid in [*_children(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry))
    return found


def run(cfg: dict) -> tuple[subprocess.Popen, str, str]:
    """Run a job to its end (killed, with its workers, if it does not end in time)."""
    proc = torchrun(cfg)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        kill_job(proc)
    return proc, out, err


def final_counts(ckpt: Path, n_events: int) -> np.ndarray:
    """The per-event trained counts in the newest complete checkpoint, loaded in this process."""
    from .online_worker import build
    net, model = build(n_events)
    assert model.restore(ckpt) is not None
    return net.trained.numpy()


@pytest.mark.parametrize("mode,sink", [("data_parallel", 2), ("hybrid_parallel", 0)])
def test_uneven_files_split_by_rank_each_event_once(tmp_path, mode, sink):
    """Files of very different sizes (most of them on one rank): each rank reads only its own files,
    the rank that runs out first keeps stepping with fill batches, the finite stream ends on both,
    and every event is trained exactly once."""
    files = write_files(tmp_path / "data", [300, 20, 260, 15, 5, 240])
    n_events = sum(len(ids) for _, ids in files)
    cfg = {"out": str(tmp_path), "mode": mode, "source": "dir", "data": str(tmp_path / "data"),
           "n_events": n_events, "batch": 16, "sink": sink, "save_steps": 5, "idle_timeout": 1.0}
    proc, out, err = run(cfg)
    assert proc.returncode == 0, err[-4000:]
    assert "done 0" in out and "done 1" in out
    seen = {r: json.loads((tmp_path / f"rank-{r}.json").read_text())["seen"] for r in (0, 1)}
    for r in (0, 1):  # each rank trained exactly its own files' events
        mine = sorted(i for name, ids in files if owner(name) == r for i in ids)
        assert sorted(seen[r]) == mine, f"rank {r}"
    counts = final_counts(tmp_path / "ckpt", n_events)
    assert (counts[1:] == 1).all(), (np.flatnonzero(counts[1:] != 1) + 1)[:10]
    assert counts[0] > 0  # the rank with less data stepped with fill batches (counted in slot 0)


def test_request_stop_on_one_rank_stops_both_after_that_step(tmp_path):
    """A callback on rank 1 alone calls request_stop() after step 7 (hybrid_parallel, normal mode):
    both ranks leave after step 7, and the final sharded checkpoint is of step 7."""
    files = write_files(tmp_path / "data", [300, 20, 260, 15, 5, 240])
    cfg = {"out": str(tmp_path), "mode": "hybrid_parallel", "source": "dir", "data": str(tmp_path / "data"),
           "n_events": sum(len(ids) for _, ids in files), "batch": 16, "sink": 0, "save_steps": 5,
           "idle_timeout": 1.0, "stop_rank": 1, "stop_step": 7}
    proc, out, err = run(cfg)
    assert proc.returncode == 0, err[-4000:]
    assert "done 0" in out and "done 1" in out
    assert [line for line in out.splitlines() if line.startswith("step")][-1] == "step 7"
    final = newest_job_position(tmp_path / "ckpt")
    assert final["step"] == 7 and all(p["file"] is not None for p in final["ranks"])


class Job:
    """A torchrun job whose stdout lines are read on a thread: the workers' pids, rank 0's steps."""

    def __init__(self, cfg: dict, restarts: int = 0):
        import queue
        import threading
        self.proc = torchrun(cfg, restarts=restarts)
        self.lines: queue.Queue = queue.Queue()
        self.pids: dict[int, int] = {}
        self.step = 0
        self.done: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float) -> str | None:
        """The next line (after noting pids, steps and done ranks), or None at the end or on timeout."""
        import queue
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            self.lines.put(None)
            return None
        words = line.split()
        if words[:1] == ["pid"]:
            self.pids[int(words[1])] = int(words[2])
        elif words[:1] == ["step"]:
            self.step = int(words[1])
        elif words[:1] == ["done"]:
            self.done.add(int(words[1]))
        return line

    def until_step(self, step: int, timeout: float = 60) -> None:
        self.until(lambda: self.step >= step, f"step {step}", timeout)

    def until(self, condition, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline or (self.next(1.0) is None and self.proc.poll() is not None):
                kill_job(self.proc)
                raise AssertionError(f"no {what}: {self.proc.stderr.read()[-3000:]}")

    def until_idle(self, quiet: float = 2.0, timeout: float = 60) -> None:
        """Until steps came, and then none for `quiet` seconds (the stream has no data left)."""
        deadline = time.monotonic() + timeout
        last, stepped = time.monotonic(), False
        while not stepped or time.monotonic() - last < quiet:
            assert time.monotonic() < deadline, "the job never went idle"
            line = self.next(0.2)
            if line is not None and line.startswith("step"):
                last, stepped = time.monotonic(), True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        kill_job(self.proc)  # after a failure: the job and its workers go too

    def finish(self, timeout: float = 60) -> str:
        while self.next(timeout) is not None:
            pass
        self.proc.wait(timeout=timeout)
        return self.proc.stderr.read()


def newest_job_position(ckpt: Path) -> dict | None:
    """The job position of the newest complete sharded checkpoint (hybrid_parallel) or file."""
    from recstream.checkpoint import is_complete, load_checkpoint
    found = sorted((p for p in ckpt.iterdir() if is_complete(p) or p.suffix == ".safetensors"),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    if found[-1].is_dir():
        return json.loads((found[-1] / "recstream_checkpoint.json").read_text())["extra"][0]["train_position"]
    return load_checkpoint(found[-1], None, restore_rng=False)["train_position"]


def _key(position: dict) -> tuple:
    return (position["file"] or "", position["offset"])


@pytest.mark.parametrize("mode,sink", [("data_parallel", 2)])
def test_sigterm_to_one_rank_stops_all_with_a_final_checkpoint(tmp_path, mode, sink):
    """SIGTERM to rank 1 alone, mid-training: both ranks stop after the same step, write the final
    checkpoint and exit 0. Restarted, the job goes on from there; SIGTERM to rank 0 while every rank
    waits for data stops it cleanly too; every event was trained exactly once."""
    files = write_files(tmp_path / "data", [200, 20, 180, 15, 5, 160])
    n_events = sum(len(ids) for _, ids in files)
    cfg = {"out": str(tmp_path), "mode": mode, "source": "dir", "data": str(tmp_path / "data"),
           "n_events": n_events, "batch": 8, "sink": sink, "save_steps": 1000, "idle_timeout": None,
           "max_delay": 0.5}  # unbounded: the last rows of a rank come as a short batch after 0.5 s
    with Job(cfg) as job:
        job.until_step(10)
        os.kill(job.pids[1], signal.SIGTERM)
        err = job.finish()
    assert job.proc.returncode == 0, err[-4000:]
    assert job.done == {0, 1}
    first = newest_job_position(tmp_path / "ckpt")
    assert first["step"] == job.step  # the final checkpoint is of the last step trained
    assert 0 < sum(_key(p) > ("", 0) for p in first["ranks"])
    committed = [json.loads((tmp_path / "ckpt" / f"committed.json.rank{r}-of-2").read_text())["position"]
                 for r in (0, 1)]
    assert committed == first["ranks"]  # every rank committed its part of the final checkpoint

    with Job(cfg) as job:  # a new life: resumes there; SIGTERM while all ranks are idle
        job.until_idle()
        os.kill(job.pids[0], signal.SIGTERM)
        err = job.finish()
    assert job.proc.returncode == 0, err[-4000:]
    assert job.done == {0, 1}
    counts = final_counts(tmp_path / "ckpt", n_events)
    assert (counts[1:] == 1).all(), (np.flatnonzero(counts[1:] != 1) + 1)[:10]


@pytest.mark.parametrize("micro", [None, 3])
def test_rank_sigkilled_job_restarted_trains_every_event_exactly_once(tmp_path, micro):
    """hybrid_parallel, 2 ranks, torchrun's elastic restart: a random rank is SIGKILLed at a random
    step, twice; torchrun restarts the whole job, which resumes from the newest complete sharded
    checkpoint. No rank ever committed a position that no complete checkpoint holds, and in the
    end every event was trained exactly once (the counts live in the checkpointed state, so what a
    killed life trained after its last checkpoint is rolled back with it). With micro-steps of 3
    rows too (batches of 8: 3 steps each, padded on a rank whose batch is short or a fill)."""
    files = write_files(tmp_path / "data", [360, 40, 300, 30, 10, 260])
    n_events = sum(len(ids) for _, ids in files)
    cfg = {"out": str(tmp_path), "mode": "hybrid_parallel", "source": "dir", "data": str(tmp_path / "data"),
           "n_events": n_events, "batch": 8, "sink": 2, "save_steps": 3, "idle_timeout": 1.0, "micro": micro}
    with Job(cfg, restarts=2) as job:
        kill_random_ranks(job, random.Random(7), 2, lambda: _assert_commits_durable(tmp_path / "ckpt"))
        err = job.finish(timeout=120)
    assert job.proc.returncode == 0, err[-4000:]
    assert err.count("failed (exitcode: -9)") == 2  # the kills were real, and each restarted the job
    _assert_commits_durable(tmp_path / "ckpt")
    counts = final_counts(tmp_path / "ckpt", n_events)
    assert (counts[1:] == 1).all(), (f"lost: {np.flatnonzero(counts[1:] == 0)[:10] + 1}, "
                                     f"duplicated: {np.flatnonzero(counts[1:] > 1)[:10] + 1}")


def kill_random_ranks(job: Job, rng: random.Random, times: int, check=None) -> None:
    """`times` times: SIGKILL a random rank a random number of steps into the current life, at a
    random moment inside a step, call `check`, and wait until torchrun started the next life."""
    for _ in range(times):
        job.until_step(job.step + rng.randint(4, 12))
        time.sleep(rng.random() * 0.05)
        victims = dict(job.pids)
        os.kill(victims[rng.randint(0, 1)], signal.SIGKILL)
        if check is not None:
            check()
        job.until(functools.partial(_restarted, job, victims), "restart")


def _restarted(job: Job, victims: dict) -> bool:
    return all(job.pids[r] != pid for r, pid in victims.items())


def _assert_commits_durable(ckpt: Path) -> None:
    """Each rank's committed position is no further than the newest complete checkpoint's (commits
    read first: a checkpoint completing meanwhile only moves the durable side forward)."""
    committed = {}
    for r in (0, 1):
        path = ckpt / f"committed.json.rank{r}-of-2"
        if path.exists():
            committed[r] = json.loads(path.read_text())["position"]
    durable = newest_job_position(ckpt)
    for r, position in committed.items():
        assert durable is not None and _key(position) <= _key(durable["ranks"][r]), (r, position, durable)


@pytest.fixture
def kafka_broker():
    """A local Kafka-protocol broker (Tansu) for one test; skipped only when it cannot run at all."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
    from recstream.testing import BrokerUnavailable, TansuBroker
    broker = TansuBroker()
    try:
        broker.start()
    except (BrokerUnavailable, OSError) as e:
        pytest.skip(f"the Tansu broker cannot run: {e}")
    yield broker
    broker.stop()


def _produce_events(broker, topic: str, sizes: list[int]) -> int:
    """Partition p gets sizes[p] events (ids from 1 on, in partition order); returns how many."""
    broker.create_topic(topic, partitions=len(sizes))
    rng, next_id = np.random.default_rng(3), 1
    for p, n in enumerate(sizes):
        x, c = rng.standard_normal((n, 2)), rng.integers(0, 50, n)
        broker.produce(topic, [f"{int(a > 0)},{next_id + i},{a:.4f},{b:.4f},{k}".encode()
                               for i, ((a, b), k) in enumerate(zip(x, c, strict=True))], partition=p)
        next_id += n
    return sum(sizes)


def test_kafka_positions_of_two_ranks_resume_in_one_process(tmp_path, kafka_broker):
    """2 data_parallel ranks stop (SIGTERM) part-way; their checkpoint's per-partition positions
    are merged and resumed by ONE process, which trains the rest: every event exactly once."""
    topic = "views"
    n_events = _produce_events(kafka_broker, topic, [200, 40, 160])
    cfg = {"out": str(tmp_path), "mode": "data_parallel", "source": "kafka", "topic": topic,
           "bootstrap": kafka_broker.bootstrap_servers, "n_events": n_events, "batch": 8, "sink": 2,
           "save_steps": 1000, "idle_timeout": 3.0}
    with Job(cfg) as job:
        job.until_step(8)
        os.kill(job.pids[0], signal.SIGTERM)
        err = job.finish()
    assert job.proc.returncode == 0 and job.done == {0, 1}, err[-4000:]
    assert newest_job_position(tmp_path / "ckpt")["step"] == job.step
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cfg["group"] = "fresh"  # no committed offsets to fall back on: only the checkpoint's positions count
    one = subprocess.run([sys.executable, str(WORKER), json.dumps(cfg)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert one.returncode == 0, one.stderr[-4000:]
    counts = final_counts(tmp_path / "ckpt", n_events)
    assert (counts[1:] == 1).all(), (f"lost: {np.flatnonzero(counts[1:] == 0)[:10] + 1}, "
                                     f"duplicated: {np.flatnonzero(counts[1:] > 1)[:10] + 1}")


def test_kafka_partitions_per_rank_rank_sigkilled_exactly_once(tmp_path, kafka_broker):
    """data_parallel, Kafka with 3 partitions of very different sizes (rank 0 reads 0 and 2, rank 1
    reads 1): a random rank is SIGKILLed twice, torchrun restarts the job, and every event is
    trained exactly once; at the end the group's committed offsets are the final checkpoint's."""
    from confluent_kafka import Consumer, TopicPartition
    topic, sizes = "clicks", [500, 60, 340]
    n_events = _produce_events(kafka_broker, topic, sizes)
    cfg = {"out": str(tmp_path), "mode": "data_parallel", "source": "kafka",
           "bootstrap": kafka_broker.bootstrap_servers, "topic": topic, "n_events": n_events, "batch": 8,
           "sink": 2, "save_steps": 3, "idle_timeout": 3.0}
    with Job(cfg, restarts=2) as job:
        kill_random_ranks(job, random.Random(11), 2)
        err = job.finish(timeout=120)
    assert job.proc.returncode == 0, err[-4000:]
    assert err.count("failed (exitcode: -9)") == 2
    counts = final_counts(tmp_path / "ckpt", n_events)
    assert (counts[1:] == 1).all(), (f"lost: {np.flatnonzero(counts[1:] == 0)[:10] + 1}, "
                                     f"duplicated: {np.flatnonzero(counts[1:] > 1)[:10] + 1}")
    final = newest_job_position(tmp_path / "ckpt")
    assert final["ranks"] == [{f"{topic}:0": 500, f"{topic}:2": 340}, {f"{topic}:1": 60}]
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "online-test"})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == sizes  # both ranks committed their part of the final checkpoint


def _events(data: Path) -> dict[int, tuple[float, float, float, int]]:
    """event id -> (label, x1, x2, c), read back from the files `write_files` wrote."""
    events = {}
    for path in sorted(data.glob("part-*.csv")):
        for line in path.read_text().splitlines():
            label, i, a, b, c = line.split(",")
            events[int(i)] = (float(label), float(a), float(b), int(c))
    return events


def _reference(steps: list[list[list[int]]], events: dict, n_events: int) -> dict:
    """One process: at each step, the mean over the 2 ranks of each rank's mean loss over its
    slice, weighted 0 for a fill/pad slice (ids 0) -- what 2 data_parallel ranks train."""
    import torch

    from recstream.features import Features
    from recstream.models import default_optimizer

    from .online_worker import build
    net, _ = build(n_events)
    optimizer = default_optimizer(net, lr=0.01, embedding="rowwise_adagrad")
    bce = torch.nn.BCEWithLogitsLoss()
    for slices in zip(*steps, strict=True):
        optimizer.zero_grad()
        loss = 0.0
        for ids in slices:
            if not any(ids):
                continue  # a fill or pad slice: weight 0
            rows = [events[i] for i in ids]
            dense = torch.tensor([[float(i), a, b] for i, (_, a, b, _) in zip(ids, rows, strict=True)]).float()
            feats = Features.from_lengths(dense, torch.tensor([r[3] for r in rows]), torch.ones(1, len(ids),
                                          dtype=torch.int64), keys=["c"])
            loss = loss + bce(net(feats), torch.tensor([r[0] for r in rows])) / len(slices)
        loss.backward()
        optimizer.step()
    return {k: v.detach() for k, v in net.named_parameters()}


def test_micro_steps_on_two_ranks_with_unequal_batches_match_one_process(tmp_path):
    """micro_batch_size=5 on 2 data_parallel ranks whose batches differ in size (files of very
    different sizes; the last batches short; one rank runs out first): the ranks agree on the steps
    per batch (the one with fewer rows pads with zero-weight slices), every event is trained once,
    and the final parameters equal a single-process run of the same slices."""
    from safetensors.torch import load_file
    files = write_files(tmp_path / "data", [300, 20, 263, 17, 5, 241])
    n_events = sum(len(ids) for _, ids in files)
    cfg = {"out": str(tmp_path), "mode": "data_parallel", "source": "dir", "data": str(tmp_path / "data"),
           "n_events": n_events, "batch": 16, "sink": 2, "save_steps": 5, "idle_timeout": 1.0, "micro": 5}
    proc, out, err = run(cfg)
    assert proc.returncode == 0, err[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]["steps"]) == len(ranks[1]["steps"])
    assert max(len(ids) for r in ranks for ids in r["steps"]) == 5
    pads = [(a, b) for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True) if not any(a) or not any(b)]
    assert pads and all(any(a) or any(b) for a, b in pads)  # padded steps happened, never on both ranks
    counts = final_counts(tmp_path / "ckpt", n_events)
    assert (counts[1:] == 1).all(), (np.flatnonzero(counts[1:] != 1) + 1)[:10]
    got = load_file(tmp_path / "params.safetensors")
    want = _reference([r["steps"] for r in ranks], _events(tmp_path / "data"), n_events)
    assert got.keys() == want.keys()
    for k in got:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
