"""The kernels one steady dynamic step dispatches on the device path, counted on a CPU.

A GPU step of a dynamic-id model (HashEmbedding features) is hundreds of small kernels (about 2 us
each, and a replayed CUDA graph's host time grows with its nodes), so what a step costs there is,
first, how many kernels it launches. This counts them without a GPU: one steady step of a dynamic
WideDeep or DeepFM (`tests/models/test_dynamic.py`'s schema: a dynamic user id and dynamic multi-hot
tags among fixed features; batch 32, tables of capacity 4,096, `default_optimizer`) trained through
`RecModel`, on CPU tensors under `recstream.hostpath.device_path` (the path CUDA runs), with the
Triton table (``table_backend="triton"``) and the row kernels in Triton's interpreter. It counts the
non-view aten ops the step dispatches (a `TorchDispatchMode`) and the Triton launches (each kernel
launch the interpreter runs), and prints them by op name, by the innermost recstream function that
dispatched them and by kernel:

    TRITON_INTERPRET=1 python -m benchmarks.dynamic_ops widedeep
    TRITON_INTERPRET=1 python -m benchmarks.dynamic_ops deepfm --fixed   # the fixed-table twin
    TRITON_INTERPRET=1 python -m benchmarks.dynamic_ops dlrm --workload bench   # bench_dynamic.py's model

``--workload bench`` counts `bench_dynamic.py`'s models and schema instead (user and item ids
dynamic, or fixed in the twin, beside two small fixed features; WideDeep, DeepFM, DCNv2, DLRM):
the workload of the GPU target "a dynamic-id model <= 1.3x its fixed-table twin", so the ratio of
the two counts is what a CPU can say of it.

Each step is one ``train(1, [batch])`` call: its epoch-end work (the loss watch's counters made again
and read, the history's record: 5 ops) is in the count. ``TRITON_INTERPRET=1`` must be set before
triton is imported (this module sets it when unset).
`tests/test_dynamic_ops.py` asserts the totals docs/benchmarks.md reports. Counts, not times: a
CPU count says nothing of a kernel's length.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import traceback
from collections import Counter

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

VIEWS = frozenset({
    "view", "_unsafe_view", "alias", "as_strided", "t", "transpose", "expand", "slice", "select", "unsqueeze",
    "squeeze", "permute", "detach", "reshape", "split", "split_with_sizes", "unbind", "narrow", "lift_fresh",
    "_reshape_alias", "view_as", "unfold", "diagonal", "chunk"})
"""Ops that launch no kernel (views, aliases): not counted."""

NO_KERNEL = frozenset({"_indices", "_values", "empty", "_sparse_coo_tensor_with_dims_and_tensors"})
"""Counted ops that launch no kernel on a GPU either (a sparse tensor's parts, an allocation, a sparse
tensor made of existing parts): reported apart, so a count's kernels can be told from its ops."""


@dataclasses.dataclass
class StepOps:
    """What one step dispatched: ops by name, ops by recstream function, launches by kernel."""

    by_op: Counter = dataclasses.field(default_factory=Counter)
    by_function: Counter = dataclasses.field(default_factory=Counter)
    by_kernel: Counter = dataclasses.field(default_factory=Counter)

    @property
    def ops(self) -> int:
        return sum(self.by_op.values())

    @property
    def no_kernel(self) -> int:
        """The ops among `ops` that launch no kernel on a GPU (`NO_KERNEL`)."""
        return sum(n for name, n in self.by_op.items() if name in NO_KERNEL)

    @property
    def launches(self) -> int:
        return sum(self.by_kernel.values())

    @property
    def kernels(self) -> int:
        """What the step launches on a GPU: its ops that launch a kernel, and the Triton launches."""
        return self.ops - self.no_kernel + self.launches


def _mode_only(name: str, args) -> bool:
    """Whether the op is one that only a dispatch mode makes the step run: autograd stores a sparse
    gradient in ``.grad`` as it is when nothing else holds its indices and values, and copies it
    (``clone``) otherwise -- as it does under a `TorchDispatchMode`, whose wrapping holds them. Without
    the mode (torch.profiler on the same step) no sparse gradient is cloned, on a CPU or a GPU alike."""
    return name == "clone" and bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_sparse


class OpCounter(TorchDispatchMode):
    """Counts the non-view aten ops dispatched while `on` into `step`, with the innermost recstream
    frame that dispatched each (``package/module.py:function``)."""

    def __init__(self):
        super().__init__()
        self.step, self.on = StepOps(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if self.on and name not in VIEWS and not name.startswith("_record_function") and not _mode_only(name, args):
            self.step.by_op[name] += 1
            frames = [f for f in traceback.extract_stack(limit=40) if "/recstream/" in f.filename]
            if frames:
                where = frames[-1]
                self.step.by_function[f"{where.filename.rsplit('/recstream/', 1)[1]}:{where.name}"] += 1
        return func(*args, **(kwargs or {}))


def count_launches(counter: OpCounter):
    """Patch the interpreter so that each launch made while `counter` is on counts once in its
    step (the interpreter's own tensor reads are no ops of the step); returns the undo."""
    import triton.runtime.interpreter as interpreter

    run = interpreter.InterpretedFunction.run

    def counted(self, *args, **kwargs):
        was, counter.on = counter.on, False
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.on = was
            if was:
                counter.step.by_kernel[getattr(self.fn, "__name__", "?")] += 1

    interpreter.InterpretedFunction.run = counted
    return lambda: setattr(interpreter.InterpretedFunction, "run", run)


def _schema(dynamic: bool):
    from recstream.data import CategoricalFeature, Schema

    dyn = {"dynamic": True, "capacity": 4096} if dynamic else {"vocab_size": 64}
    return Schema(["d0", "d1"], [
        CategoricalFeature("item", vocab_size=20, embedding_dim=4),
        CategoricalFeature("user", embedding_dim=4, **dyn),
        CategoricalFeature("tags", multi_hot=True, pooling="mean", embedding_dim=4,
                           **({**dyn, "permit_filter_value": 2} if dynamic else dyn)),
        CategoricalFeature("genre", vocab_size=5, multi_hot=True, embedding_dim=4),
    ])


def _batches(n: int, names: tuple[str, ...], b: int = 32, seed: int = 0, dynamic: bool = True) -> list:
    """`tests/models/test_dynamic.py`'s batches: huge raw user ids, label = user parity + d0; for
    the fixed twin (not `dynamic`) the user and tag ids taken into its vocabularies of 64."""
    from recstream.data import Batch, Features

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        user = torch.randint(10 ** 12, 10 ** 12 + 40, (b,), generator=g)
        n_tags, n_genre = torch.randint(0, 4, (b,), generator=g), torch.randint(0, 3, (b,), generator=g)
        tags = torch.randint(-3, 50, (int(n_tags.sum()),), generator=g)
        values = torch.cat([torch.randint(0, 20, (b,), generator=g), user if dynamic else user % 64,
                            tags if dynamic else tags + 3,
                            torch.randint(0, 5, (int(n_genre.sum()),), generator=g)])
        lengths = torch.stack([torch.ones(b, dtype=torch.int64), torch.ones(b, dtype=torch.int64), n_tags, n_genre])
        dense = torch.randn(b, 2, generator=g)
        p = torch.sigmoid(2.0 * (user % 2).float() - 1.0 + dense[:, 0])
        # `.to`: the batch as a loader hands it to a step (its feature sizes known on the host)
        features = dataclasses.replace(Features.from_lengths(dense, values, lengths), keys=names).to("cpu")
        out.append(Batch(features, (torch.rand(b, generator=g) < p).float()))
    return out


WORKLOADS = {"test": ("widedeep", "deepfm"), "bench": ("widedeep", "deepfm", "dcnv2", "dlrm")}
"""The models each workload counts: ``test`` (`tests/models/test_dynamic.py`'s schema) or ``bench``
(`bench_dynamic.py`'s, the GPU target's: user and item dynamic beside two fixed features)."""


def _bench_setup(model: str, dynamic: bool, n: int):
    """`bench_dynamic.py`'s model and `n` batches (its schema; 64 events a batch, ids over 1,000 rows:
    a count does not depend on the batch size), each batch as a loader hands it to a step."""
    from benchmarks import bench_dynamic
    from recstream.data import Batch

    net = bench_dynamic.MODELS[model](bench_dynamic.schema(1000, dynamic))
    return net, [Batch(x.to("cpu"), y) for x, y in bench_dynamic.batches(n, 64, 1000)]


def count_step(model: str = "widedeep", dynamic: bool = True, warm: int = 5, steps: int = 3,
               workload: str = "test") -> list[StepOps]:
    """`steps` steady steps' counts (after `warm` steps) of `model` on `workload` (`WORKLOADS`)."""
    from recstream import RecModel
    from recstream.hostpath import device_path
    from recstream.models import DeepFM, WideDeep, ctr_metrics, default_optimizer
    from recstream.nn import HashEmbedding
    from recstream.optim.triton_rows import interpreted

    if workload not in WORKLOADS:
        raise ValueError(f"dynamic_ops: workload={workload!r}; allowed: {sorted(WORKLOADS)}")
    if model not in WORKLOADS[workload]:
        raise ValueError(f"dynamic_ops: model={model!r}; allowed: {sorted(WORKLOADS[workload])}")
    torch.manual_seed(0)
    if workload == "bench":
        net, data = _bench_setup(model, dynamic, warm + steps)
        metrics, optimizer = None, default_optimizer(net)  # as bench_dynamic trains it
    else:
        schema = _schema(dynamic)
        net = {"widedeep": WideDeep, "deepfm": DeepFM}[model](schema, hidden=(16, 8), embedding_dim=4)
        data = _batches(warm + steps, tuple(f.name for f in schema.categorical), dynamic=dynamic)
        metrics, optimizer = ctr_metrics(), default_optimizer(net, lr=1e-2)
    for m in net.modules():
        if isinstance(m, HashEmbedding):
            m.table_backend = "triton"
    trainer = RecModel(net, torch.nn.BCEWithLogitsLoss(), optimizer, metrics=metrics, progress_bar=False)
    counter, out = OpCounter(), []
    undo = count_launches(counter)
    try:
        with interpreted(), device_path(), counter:
            for i, batch in enumerate(data):
                counter.step, counter.on = StepOps(), i >= warm
                trainer.train(1, [batch])
                if counter.on:
                    out.append(counter.step)
    finally:
        counter.on = False
        undo()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="widedeep", choices=WORKLOADS["bench"])
    parser.add_argument("--fixed", action="store_true", help="the fixed-table twin (vocabularies)")
    parser.add_argument("--workload", default="test", choices=sorted(WORKLOADS),
                        help="test: tests/models/test_dynamic.py's schema; bench: bench_dynamic.py's")
    parser.add_argument("--top", type=int, default=40, help="op names and functions to list")
    args = parser.parse_args(argv)
    steps = count_step(args.model, dynamic=not args.fixed, workload=args.workload)
    last = steps[-1]
    kind = "fixed" if args.fixed else "dynamic"
    print(f"{args.model} {kind} ({args.workload} workload): {last.ops} ops + {last.launches} launches a steady step "
          f"(steps: {[(s.ops, s.launches) for s in steps]}); {last.no_kernel} of the ops launch no kernel on a "
          f"GPU ({', '.join(sorted(NO_KERNEL))}): {last.kernels} kernels")
    for title, counts, top in (("by kernel", last.by_kernel, None), ("by recstream function", last.by_function,
                                                                     args.top), ("by op", last.by_op, args.top)):
        print(f"\n{title}:")
        for key, n in counts.most_common(top):
            print(f"{n:5d} {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
