"""`benchmarks/dynamic_ops.py`: the ops and Triton launches of one steady dynamic WideDeep / DeepFM
step on the device path, counted on a CPU (the totals docs/benchmarks.md reports). A change that
adds kernels to the step fails here; one that removes some lowers these numbers."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available():  # the interpreter must be on before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="the counts run the Triton kernels in the interpreter (optional package triton)")

from benchmarks import dynamic_ops  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason=(
    "triton was imported for a GPU here (TRITON_INTERPRET unset): the counts need its interpreter"))

# (ops, launches) of a steady step; the kernels launched
TABLES = {"_starts_fn": 2, "_runs_fn": 2, "_probe_fn": 2, "_round_fn": 8, "_carry_out_fn": 2, "_gather_fn": 2}
COUNTS = {  # two Triton tables; FTRL for the wide weights, row-wise Adagrad for the embeddings
    "widedeep": (147, 24, {**TABLES, "ftrl": 3, "rowwise_adagrad": 3}),
    "deepfm": (168, 22, {**TABLES, "rowwise_adagrad": 4}),
}


@interpreted
@pytest.mark.parametrize("model", sorted(COUNTS))
def test_a_steady_dynamic_step_dispatches_the_documented_ops_and_launches(model):
    ops, launches, kernels = COUNTS[model]
    steps = dynamic_ops.count_step(model, warm=5, steps=2)
    assert [(s.ops, s.launches) for s in steps] == [(ops, launches)] * 2, [(s.ops, s.launches) for s in steps]
    assert dict(steps[-1].by_kernel) == kernels
    assert sum(steps[-1].by_function.values()) <= ops  # every op named by its recstream function, most of them
    assert 0 < steps[-1].no_kernel < ops // 4  # sparse gradients' parts, scratch allocations


@interpreted
@pytest.mark.parametrize("model,ops,launches", [("widedeep", 107, 4), ("deepfm", 128, 2)])
def test_the_fixed_table_twin_dispatches_the_documented_ops_and_launches(model, ops, launches):
    """The same models with vocabularies where the dynamic features were: the row updates' launches only."""
    step = dynamic_ops.count_step(model, dynamic=False, warm=2, steps=1)[-1]
    assert (step.ops, step.launches) == (ops, launches)
    assert "_round_fn" not in step.by_kernel


@interpreted
def test_bench_dynamics_widedeep_and_its_twin_dispatch_the_documented_kernels():
    """The workload of the GPU target (`bench_dynamic.py`: user and item dynamic or fixed): what a
    dynamic table adds to a step, in kernels, against a fixed feature (none: it joins the fused
    tables' lookup)."""
    dynamic, fixed = (dynamic_ops.count_step("widedeep", dynamic=d, warm=4, steps=1, workload="bench")[-1]
                      for d in (True, False))
    assert ((dynamic.ops, dynamic.launches, dynamic.kernels), (fixed.ops, fixed.launches, fixed.kernels)) == (
        (145, 24, 137), (87, 4, 81))


def test_a_sparse_gradient_is_cloned_into_grad_only_under_a_dispatch_mode():
    """What `dynamic_ops._mode_only` leaves out of the count: a dynamic lookup's sparse gradient goes
    into ``.grad`` as it is (torch.profiler sees no clone), but is cloned under a dispatch mode."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    from recstream.hostpath import device_path
    from recstream.nn import HashEmbedding

    emb = HashEmbedding(4, capacity=64)
    emb.table_backend = "torch"

    def backward(mode):
        emb.values.grad = None
        with device_path():
            out = emb(torch.arange(10) * 7919)
        with mode:
            out.square().sum().backward()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        backward(contextlib.nullcontext())
    assert emb.values.grad.is_sparse and not [e for e in prof.events() if e.name == "aten::clone"]

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            self.ops.append((name, dynamic_ops._mode_only(name, args)))
            return func(*args, **(kwargs or {}))

    seen = Seen()
    backward(seen)
    assert ("clone", True) in seen.ops  # the mode's own copy, which the count leaves out


def test_an_unknown_model_or_workload_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match=r"model='dlrm'; allowed: \['deepfm', 'widedeep'\]"):
        dynamic_ops.count_step("dlrm")
    with pytest.raises(ValueError, match=r"workload='criteo'; allowed: \['bench', 'test'\]"):
        dynamic_ops.count_step("dlrm", workload="criteo")
