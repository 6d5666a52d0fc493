"""`recstream.nn.hash_replay`: what a HashEmbedding step does on the host, recorded and applied again
as a replayed CUDA graph needs, and the device path's steps free of host numbers a graph would bake.

Runs on CPU tensors under ``recstream.hostpath.device_path`` (the ops CUDA runs); the Triton backend
in Triton's interpreter. The CUDA graph itself is tested on a GPU (tests/train/test_cuda_graph.py)."""
from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from recstream.hostpath import device_path
from recstream.nn import HashEmbedding
from recstream.nn.hash_replay import HostEvent


def _keys(step: int, batch: int = 16, span: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, span, (batch,), generator=g) * 7919 + 2 ** 40


def _train_step(emb: HashEmbedding, keys: torch.Tensor) -> None:
    with device_path():
        emb(keys).sum().backward()
        emb.pop_reset_rows()  # what an optimizer takes each step
        emb.values.grad = None


def _recorded_step(emb: HashEmbedding, keys: torch.Tensor) -> tuple[HostEvent, ...]:
    emb.record_host()
    _train_step(emb, keys)
    return emb.recorded_host()


def _host(emb: HashEmbedding):
    snap = emb.host_snapshot()
    return snap.step, snap.counts, snap.stale, snap.table


def test_a_step_with_room_replays_its_host_side_exactly():
    emb = HashEmbedding(4, capacity=512, permit_filter_value=2, param_init="ones")
    for i in range(3):
        _train_step(emb, _keys(i))
    before = emb.host_snapshot()
    events = _recorded_step(emb, _keys(3))
    assert events == (HostEvent("step"), HostEvent("room", 16))
    after = _host(emb)
    emb.restore_host(before)
    assert emb.replay_ready(events)
    emb.replay_host(events)
    assert _host(emb) == after


def test_a_step_that_reads_the_counters_is_not_replayable_and_room_runs_out():
    emb = HashEmbedding(4, capacity=64, param_init="ones")
    events = [_recorded_step(emb, _keys(i, span=200)) for i in range(6)]
    # 16 keys a step against 64 rows: the bounds show room for 4 steps, then the counters are read
    assert events[0] == (HostEvent("step"), HostEvent("room", 16))
    assert HostEvent("other", 16) in events[4]
    assert not emb.replay_ready(events[4])
    while emb.replay_ready(events[0]):  # a replayed step uses up the bounds as the Python step did
        emb.replay_host(events[0])
    assert emb._free_bound < 16


def test_an_age_pass_every_other_step_is_replayed_only_on_its_own_steps():
    emb = HashEmbedding(4, capacity=512, evict_filter_value=5, evict_interval=2, param_init="ones")
    odd = _recorded_step(emb, _keys(0))  # step 1: no age pass
    even = _recorded_step(emb, _keys(1))  # step 2: the age pass
    assert odd[0] == HostEvent("step", age=False) and even[0] == HostEvent("step", age=True)
    assert emb.replay_ready(odd) and not emb.replay_ready(even)  # the next one is step 3


class _Ops(TorchDispatchMode):
    """Every dispatched op with its non-tensor arguments and its tensors' shapes: what a CUDA graph
    would hold of a step."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        leaves, _ = tree_flatten((args, kwargs or {}))
        self.ops.append((str(func), tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x
                                          for x in leaves)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_steady_steps_dispatch_the_same_ops_with_the_same_arguments(backend, monkeypatch):
    """A captured graph replays the ops of the step it captured, with their arguments as they were
    then: two steady steps must not differ in any (the step count was a host int before: a graph
    wrote the capture's step into every replay's last-seen entries)."""
    if backend == "triton":
        pytest.importorskip("triton")
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton's interpreter runs the kernels on CPU tensors (a GPU is here)")
        from recstream.nn import hash_triton

        launched, launch = [], hash_triton._launch

        def spy(kernel, n, *args, **meta):
            launched[-1].append((n, tuple(a for a in args if not isinstance(a, torch.Tensor)),
                                 tuple(sorted(meta.items()))))
            return launch(kernel, n, *args, **meta)
        monkeypatch.setattr(hash_triton, "_launch", spy)
    emb = HashEmbedding(4, capacity=4096, permit_filter_value=2, evict_filter_value=50, param_init="ones")
    emb.table_backend = backend
    steps = []
    for i in range(5):
        if backend == "triton":
            launched.append([])
        keys = _keys(i)
        with _Ops() as mode:
            _train_step(emb, keys)
        steps.append(mode.ops)
    assert steps[3] == steps[4]
    assert len(steps[4]) > 20
    if backend == "triton":
        assert launched[3] == launched[4] and len(launched[4]) >= 3
