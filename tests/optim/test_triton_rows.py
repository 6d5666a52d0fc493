"""The fused Triton row updates (`recstream.optim.triton_rows`, what CUDA runs) leave the same tables
and state as the torch-op device path and the host's C kernels, checked on CPU tensors with Triton's
interpreter: duplicate ids, empty batches, several tables in a fused set, capturable mode with
``found_inf`` skipping, and state dicts interchangeable between the paths."""
import copy
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Before the kernels are first imported (they are decorated then); only where there is no GPU: on a
# GPU machine the whole suite runs in one process, and the compiled kernels are what its CUDA tests
# (test_triton_rows_cuda.py) check.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from recstream.hostpath import device_path  # noqa: E402
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad, triton_rows  # noqa: E402
from recstream.optim.sparse_rows import accept_sparse_rows  # noqa: E402
from recstream.testing import SyncCounter  # noqa: E402

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the compiled kernels instead "
                                "(tests/optim/test_triton_rows_cuda.py); Triton's interpreter is the check without one")

OPTIMIZERS = {
    "ftrl": lambda p: FTRL(p, lr=0.1, l1=0.05, l2=0.01),
    "ftrl_power": lambda p: FTRL(p, lr=0.1, l1=0.05, l2=0.01, lr_power=-0.3),
    "rowwise_adagrad": lambda p: RowWiseAdagrad(p, lr=0.1, weight_decay=0.01),
    "lazy_adam": lambda p: LazyAdam(p, lr=0.05),
}
PATHS = ("host", "torch", "triton")  # the C kernels, the torch ops CUDA ran before, the fused kernels


@pytest.fixture(scope="module", autouse=True)
def _interpreter_started():
    """One optimizer step and one tiny launch first: the first of each in a process costs seconds
    (imports: torch.optim's first step loads torch._dynamo), not any test's work."""
    _train(OPTIMIZERS["lazy_adam"], "host", _batches(1))
    with triton_rows.interpreted():
        triton_rows.rowwise_adagrad(torch.zeros(2, 1), torch.zeros(2), torch.tensor([1]), torch.ones(1, 1), 0.1,
                                    1e-10, 0.0)


def _path(name: str):
    if name == "host":
        return torch.enable_grad()  # nothing forced: CPU tensors take the C kernels
    if name == "torch":
        return device_path()

    class Both:
        def __enter__(self):
            self._a, self._b = device_path(), triton_rows.interpreted()
            self._a.__enter__()
            self._b.__enter__()

        def __exit__(self, *exc):
            self._b.__exit__(*exc)
            self._a.__exit__(*exc)
    return Both()


def _batches(steps: int, n: int = 10, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 6, (n,), generator=g), torch.randn(n, 4, generator=g)) for _ in range(steps)]


def _tables(dims=(4, 1)):
    torch.manual_seed(0)
    return [torch.nn.Embedding(12, d, sparse=True) for d in dims]


LAUNCHES = [0]


@pytest.fixture(autouse=True)
def _counted_launches(monkeypatch):
    """Count the kernels' launches, so a test of the fused path sees that it ran (not a fallback)."""
    original = triton_rows._launch

    def launch(*args, **meta):
        LAUNCHES[0] += 1
        original(*args, **meta)
    monkeypatch.setattr(triton_rows, "_launch", launch)


def _step(tables, opt, ids, weights, path: str):
    loss = sum((t(ids) * weights[:, :t.embedding_dim]).sum() for t in tables)
    opt.zero_grad()
    loss.backward()
    before = LAUNCHES[0]
    with _path(path):
        opt.step()
    if path == "triton" and ids.numel():
        assert LAUNCHES[0] > before, "the fused kernels did not run"


def _train(make, path: str, batches, dims=(4, 1)):
    tables = _tables(dims)
    opt = make([t.weight for t in tables])
    for ids, weights in batches:
        _step(tables, opt, ids, weights, path)
    return tables, opt


def _assert_same(a_tables, a_opt, b_tables, b_opt):
    for ta, tb in zip(a_tables, b_tables, strict=True):
        torch.testing.assert_close(tb.weight.detach(), ta.weight.detach(), rtol=1e-5, atol=1e-6)
        sa, sb = a_opt.state[ta.weight], b_opt.state[tb.weight]
        assert sorted(sa) == sorted(sb)
        for key, value in sa.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(sb[key].to(value.dtype), value, rtol=1e-5, atol=1e-6, msg=key)
            else:
                assert sb[key] == value, key


def test_the_kernels_stay_off_a_cpu_table_unless_interpreted():
    assert not triton_rows.applies([torch.zeros(3, 2)])
    with triton_rows.interpreted():
        assert triton_rows.applies([torch.zeros(3, 2)])
        assert not triton_rows.applies([torch.zeros(3, 2, dtype=torch.float64)])  # the torch ops take other dtypes


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_fused_kernel_matches_the_torch_ops_and_the_c_kernels(name):
    batches = _batches(3)  # 10 ids of 6 rows per step: every step repeats rows
    runs = {path: _train(OPTIMIZERS[name], path, batches) for path in PATHS}
    _assert_same(*runs["host"], *runs["triton"])
    _assert_same(*runs["torch"], *runs["triton"])
    touched = set().union(*(set(ids.tolist()) for ids, _ in batches))
    moved = (runs["triton"][0][0].weight.detach() != _tables()[0].weight.detach()).any(dim=1)
    assert {i for i, m in enumerate(moved.tolist()) if m} == touched  # untouched rows stay


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_runs_that_cross_the_programs_blocks_match_the_torch_ops(name):
    """1,500 entries of 12 rows: a width-3 table's programs take 256 entries each (6 programs, the
    last one partial, runs of ~125 entries crossing their edges, a padded column), width 1 takes 1,024."""
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 12, (1500,), generator=g), torch.randn(1500, 4, generator=g)) for _ in range(2)]
    runs = {path: _train(OPTIMIZERS[name], path, batches, dims=(3, 1)) for path in ("torch", "triton")}
    _assert_same(*runs["torch"], *runs["triton"])


@pytest.mark.parametrize("name", ["ftrl", "rowwise_adagrad", "lazy_adam"])
@pytest.mark.parametrize("capturable", [False, True])
def test_dense_gradients_take_one_launch_each_and_match_the_other_paths(name, capturable):
    """Dense gradients (a 0-d, a 1-D and a 2-D parameter: a wide model's bias and linear terms) are
    every row at once: one launch per parameter, no sort; capturable with found_inf on step 2."""
    def run(path):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(())), torch.nn.Parameter(torch.randn(5)),
                  torch.nn.Parameter(torch.randn(3, 4))]
        opt = OPTIMIZERS[name](params)
        if capturable:
            _capturable(opt)
        g = torch.Generator().manual_seed(2)
        for i in range(3):
            if capturable:
                opt.found_inf = torch.tensor(1.0 if i == 1 else 0.0)
            opt.zero_grad()
            sum((p * torch.randn(p.shape, generator=g)).sum() for p in params).backward()
            before = LAUNCHES[0]
            with _path(path):
                opt.step()
            assert (LAUNCHES[0] - before) == (3 if path == "triton" else 0)
        return params, opt

    def same(a, b):
        for pa, pb in zip(a[0], b[0], strict=True):
            torch.testing.assert_close(pb.detach(), pa.detach(), rtol=1e-5, atol=1e-6)
            for key, value in a[1].state[pa].items():
                if isinstance(value, torch.Tensor):
                    torch.testing.assert_close(b[1].state[pb][key].to(value.dtype), value, rtol=1e-5, atol=1e-6)
                else:
                    assert b[1].state[pb][key] == value
    triton_run = run("triton")
    same(run("torch"), triton_run)
    if not capturable:
        same(run("host"), triton_run)


def test_a_step_is_one_launch_per_table_and_no_host_read():
    tables = _tables()
    opt = LazyAdam([t.weight for t in tables], lr=0.05)
    ids, weights = _batches(1)[0]
    _step(tables, opt, ids, weights, "triton")  # state created
    loss = sum((t(ids) * weights[:, :t.embedding_dim]).sum() for t in tables)
    opt.zero_grad()
    loss.backward()
    counter = SyncCounter()
    original = triton_rows._launch

    def launch(kernel, *args, **meta):
        with counter.one_op("triton"):
            original(kernel, *args, **meta)
    triton_rows._launch = launch
    try:
        with _path("triton"), counter:
            opt.step()
    finally:
        triton_rows._launch = original
    assert counter.launches == {"triton": 2} and counter.syncs == 0, (counter.launches, dict(counter.sync_ops))


@pytest.mark.parametrize("name", ["ftrl", "rowwise_adagrad", "lazy_adam"])
def test_an_empty_batch_advances_the_count_and_changes_no_row(name):
    tables = _tables()
    opt = OPTIMIZERS[name]([t.weight for t in tables])
    _step(tables, opt, *_batches(1)[0], "triton")
    before = [t.weight.detach().clone() for t in tables]
    state = {k: v.clone() for t in tables for k, v in opt.state[t.weight].items() if isinstance(v, torch.Tensor)}
    _step(tables, opt, torch.zeros(0, dtype=torch.long), torch.zeros(0, 4), "triton")
    for a, t in zip(before, tables, strict=True):
        assert torch.equal(a, t.weight.detach())
    after = {k: v for t in tables for k, v in opt.state[t.weight].items() if isinstance(v, torch.Tensor)}
    assert all(torch.equal(v, after[k]) for k, v in state.items())
    assert all(opt.state[t.weight]["step"] == 2 for t in tables)


def test_padding_ids_and_zero_weight_rows_match_the_torch_ops():
    """A padded batch (ids 0 with zero weight, as a short last batch padded for a CUDA graph): the
    padding rows get a zero gradient; both device paths treat them alike."""
    def run(path):
        tables = _tables()
        opt = LazyAdam([t.weight for t in tables], lr=0.05)
        for ids, weights in _batches(2):
            ids, weights = ids.clone(), weights.clone()
            ids[-4:], weights[-4:] = 0, 0.0
            _step(tables, opt, ids, weights, path)
        return tables, opt
    _assert_same(*run("torch"), *run("triton"))


def _capturable(opt):
    for group in opt.param_groups:
        group["capturable"] = True
        group["lr"] = torch.tensor(float(group["lr"]))
    return opt


@pytest.mark.parametrize("name", ["ftrl", "rowwise_adagrad", "lazy_adam"])
def test_capturable_steps_skip_an_overflow_on_the_device_like_the_torch_ops(name):
    """Step counts and rates as tensors; ``found_inf`` set on the second of three steps: that step
    writes nothing (weights, state, count), on both device paths, and the others match."""
    def run(path):
        tables = _tables()
        opt = _capturable(OPTIMIZERS[name]([t.weight for t in tables]))
        snapshots = []
        for i, (ids, weights) in enumerate(_batches(3)):
            opt.found_inf = torch.tensor(1.0 if i == 1 else 0.0)
            _step(tables, opt, ids, weights, path)
            snapshots.append([t.weight.detach().clone() for t in tables])
        return tables, opt, snapshots
    torch_run, triton_run = run("torch"), run("triton")
    _assert_same(*torch_run[:2], *triton_run[:2])
    for a, b in zip(triton_run[2][0], triton_run[2][1], strict=True):
        assert torch.equal(a, b)  # the overflowing step moved nothing
    assert all(float(triton_run[1].state[t.weight]["step"]) == 2 for t in triton_run[0])
    assert isinstance(triton_run[1].state[triton_run[0][0].weight]["step"], torch.Tensor)


@pytest.mark.e2e  # six interpreted runs: over tier 1's 5 s on a loaded 2-core box
def test_boost_adam_on_a_fused_set_and_on_single_tables_matches_the_other_paths():
    """boost's lazy Adam on a user's ``torch.optim.Adam``: three tables of one width as one fused set
    (one launch for the three), a width-1 table alone."""
    def run(path, fuse):
        tables = _tables((4, 4, 4, 1))
        params = [t.weight for t in tables]
        opt = torch.optim.Adam(params, lr=0.05)
        handle = accept_sparse_rows(opt, params, fuse=fuse)
        for ids, weights in _batches(3):
            _step(tables, opt, ids, weights, path)
        assert len(handle.fused) == (1 if fuse else 0)
        return tables, opt
    for fuse in (True, False):
        triton_run = run("triton", fuse)
        for path in ("host", "torch"):
            other = run(path, fuse)
            for a, b in zip(other[0], triton_run[0], strict=True):
                torch.testing.assert_close(b.weight.detach(), a.weight.detach(), rtol=1e-5, atol=1e-6)
            for a, b in zip(other[0], triton_run[0], strict=True):
                for key in ("exp_avg", "exp_avg_sq", "step"):
                    torch.testing.assert_close(triton_run[1].state[b.weight][key], other[1].state[a.weight][key],
                                               rtol=1e-5, atol=1e-6)


def test_boost_adam_on_a_capturable_fused_set_matches_the_torch_ops():
    """A captured step's form: one device step counter shared by the set, the rate a device tensor."""
    def run(path):
        tables = _tables((4, 4))
        params = [t.weight for t in tables]
        opt = torch.optim.Adam(params, lr=0.05)
        handle = accept_sparse_rows(opt, params, fuse=True)
        opt.param_groups[0].update(capturable=True, lr=torch.tensor(0.05))
        for ids, weights in _batches(2):
            _step(tables, opt, ids, weights, path)
        assert len(handle.fused) == 1
        return tables, opt
    torch_run, triton_run = run("torch"), run("triton")
    for a, b in zip(torch_run[0], triton_run[0], strict=True):
        torch.testing.assert_close(b.weight.detach(), a.weight.detach(), rtol=1e-5, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(triton_run[1].state[b.weight][key], torch_run[1].state[a.weight][key],
                                       rtol=1e-5, atol=1e-6)
    assert triton_run[1].state[triton_run[0][0].weight]["step"] is triton_run[1].state[triton_run[0][1].weight]["step"]


def _flagged_boost_run(fuse: bool, overflow_at: int | None):
    """boost's lazy Adam on the kernels, each step handed ``found_inf``; an overflowing batch (NaN
    gradients, the flag 1) inserted before clean step `overflow_at`. Returns (tables, optimizer,
    the tensors before and after the overflowing step)."""
    tables = _tables((4, 4, 1))
    params = [t.weight for t in tables]
    opt = torch.optim.Adam(params, lr=0.05, fused=True)
    assert len(accept_sparse_rows(opt, params, fuse=fuse).fused) == (1 if fuse else 0)
    order = [(ids, weights, False) for ids, weights in _batches(3)]
    if overflow_at is not None:
        order.insert(overflow_at, (*order[overflow_at][:2], True))
    snaps = []
    for ids, weights, bad in order:
        opt.zero_grad(set_to_none=True)
        (sum((t(ids) * weights[:, :t.embedding_dim]).sum() for t in tables) * (float("nan") if bad else 1.0)).backward()
        if bad:
            snaps.append(_tensors(tables, opt))
        opt.found_inf = torch.tensor(float(bad))
        before = LAUNCHES[0]
        with _path("triton"):
            opt.step()
        del opt.found_inf
        assert LAUNCHES[0] > before, "the fused kernels did not run"
        if bad:
            snaps.append(_tensors(tables, opt))
    return tables, opt, snaps


def _tensors(tables, opt) -> list[torch.Tensor]:
    return [x.detach().clone() for t in tables
            for x in (t.weight, opt.state[t.weight]["exp_avg"], opt.state[t.weight]["exp_avg_sq"],
                      torch.as_tensor(opt.state[t.weight]["step"]))]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "per_table"])
def test_boost_adam_kernels_skip_an_overflow_from_the_flag(fuse):
    """The kernels' ``found`` masks every write of an overflowing step (HAS_FOUND) and the count is
    taken back on the device: rows, moments and step counts stay, and the steps after it equal those
    of a run that never saw it."""
    tables, opt, (before, after) = _flagged_boost_run(fuse, overflow_at=1)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    clean_tables, clean_opt, _ = _flagged_boost_run(fuse, overflow_at=None)
    for a, b in zip(_tensors(tables, opt), _tensors(clean_tables, clean_opt), strict=True):
        assert torch.equal(a, b)
    assert all(float(opt.state[t.weight]["step"]) == 3.0 for t in tables)


@pytest.mark.parametrize("name", ["ftrl", "rowwise_adagrad", "lazy_adam"])
def test_a_state_dict_written_on_the_kernels_loads_on_the_c_path_and_back(name):
    """Same keys, shapes and types on every path; a checkpoint of two fused-kernel steps, loaded by a
    host optimizer, continues as the fused-kernel run continues."""
    batches = _batches(3)
    tables, opt = _train(OPTIMIZERS[name], "triton", batches[:2])
    host_tables, host_opt = _train(OPTIMIZERS[name], "host", batches[:2])
    sd, host_sd = opt.state_dict(), host_opt.state_dict()
    assert sd["param_groups"] == host_sd["param_groups"]
    for key, entry in host_sd["state"].items():
        assert {k: (type(v), getattr(v, "shape", None)) for k, v in entry.items()} == \
            {k: (type(v), getattr(v, "shape", None)) for k, v in sd["state"][key].items()}
    loaded = _tables()
    for t, src in zip(loaded, tables, strict=True):
        t.weight.data.copy_(src.weight.detach())
    resumed = OPTIMIZERS[name]([t.weight for t in loaded])
    resumed.load_state_dict(copy.deepcopy(sd))  # a load keeps the tensors it is given: a copy, as from a file
    _step(loaded, resumed, *batches[2], "host")
    _step(tables, opt, *batches[2], "triton")
    _assert_same(tables, opt, loaded, resumed)
    back = OPTIMIZERS[name]([t.weight for t in host_tables])
    back.load_state_dict(copy.deepcopy(host_sd))
    _step(host_tables, back, *batches[2], "triton")
    _assert_same(tables, opt, host_tables, back)


def test_interpreted_refuses_kernels_compiled_for_a_gpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"), triton_rows.interpreted():
        pass


WARM, STEPS = 3, 3


def _widedeep_ops(fused: bool) -> tuple[int, float, dict]:
    """(sync-forcing ops per steady step, dispatched ops per steady step, launches in the last) of
    `Model.train` on WideDeep with `default_optimizer` (FTRL + RowWiseAdagrad + Adam) on the device
    path; `fused`: the row updates as Triton launches (each counted as one op)."""
    from torch import nn

    from recstream import Model
    from recstream.callbacks.base import Callback
    from recstream.models import default_optimizer
    from tests.models.helpers import BUILDERS, LogisticData, mixed_schema

    counter = SyncCounter()

    class Steps(Callback):
        def on_train_step_begin(self, ctx):
            counter.mark()
            counter.launches.clear()

    original = triton_rows._launch

    def launch(kernel, *args, **meta):
        with counter.one_op("triton"):
            original(kernel, *args, **meta)
    schema = mixed_schema()
    torch.manual_seed(0)
    net = BUILDERS["widedeep"](schema)
    model = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2), metrics={"auc", "loss"},
                  progress_bar=False)
    triton_rows._launch = launch
    try:
        with device_path(), triton_rows.interpreted() if fused else torch.enable_grad(), counter:
            model.train(1, LogisticData(schema, WARM + STEPS + 1, 16), callbacks=[Steps()])
    finally:
        triton_rows._launch = original
    steady = counter.per_step[1 + WARM:]
    assert len(steady) == STEPS
    return max(s.syncs for s in steady), sum(s.ops for s in steady) / STEPS, dict(counter.launches)


@pytest.mark.e2e  # fourteen interpreted training steps
def test_a_widedeep_step_dispatches_fewer_ops_with_the_fused_kernels():
    """Counted on a CPU (the ops a GPU step dispatches, not a GPU measurement): the steady WideDeep step
    with the row updates as one launch per table, against the torch-op device path; no host read on either."""
    syncs_before, before, _ = _widedeep_ops(fused=False)
    syncs_after, after, launches = _widedeep_ops(fused=True)
    print(f"\nWideDeep steady step, device path: {before:.0f} dispatched ops (torch ops) -> {after:.0f} "
          f"(fused row updates, {launches} launches)")
    assert syncs_before == syncs_after == 0
    # FTRL: the wide table, its bias and its dense-feature weights; RowWiseAdagrad: the embedding table
    assert launches == {"triton": 4}
    assert after < before - 30, (before, after)


def test_without_triton_the_kernels_are_off_and_a_step_runs_the_other_paths(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    monkeypatch.delitem(sys.modules, "recstream.optim._triton_row_kernels")
    monkeypatch.delattr(sys.modules["recstream.optim"], "_triton_row_kernels")  # re-imported, not reused
    monkeypatch.setattr(triton_rows, "_kernels", None)
    assert triton_rows._triton_kernels() is None
    with pytest.raises(RuntimeError, match="Triton is not installed"), triton_rows.interpreted():
        pass
    tables = _tables()
    opt = LazyAdam([t.weight for t in tables], lr=0.05)
    _step(tables, opt, *_batches(1)[0], "torch")
    assert opt.state[tables[0].weight]["step"] == 1


def test_a_device_takes_the_kernels_only_where_they_step_like_the_torch_ops(monkeypatch, caplog):
    """`kernels_work` steps small tables with the kernels and without once per device: a kernel that
    fails (e.g. one this machine's Triton cannot compile) or disagrees sends the device's updates to
    the torch ops, with a warning, before any real table depends on it."""
    from recstream.optim import kernel_check

    check = kernel_check._kernels_match_torch
    assert triton_rows._device_check is check
    with triton_rows.interpreted():  # the interpreter stands in for a GPU
        check.cache_clear()
        assert check("cpu")
        check.cache_clear()
        kernels = triton_rows._triton_kernels()

        class Broken:
            def __getitem__(self, grid):
                raise RuntimeError("PassManager::run failed")

        monkeypatch.setattr(kernels, "ftrl", Broken())
        assert not check("cpu")
        assert "row kernels failed on cpu (RuntimeError: PassManager::run failed)" in caplog.text
        assert triton_rows.ENABLED
        check.cache_clear()


def test_gradient_entries_read_a_coo_gradient_in_views_alone_and_refuse_other_sparse_dims():
    """The entries of a row-sparse gradient are its indices and values (no ``sparse_dim`` query:
    the indices' shape says it); a gradient sparse in two dims is not one (None)."""
    grad = torch.sparse_coo_tensor(torch.tensor([[2, 0, 2]]), torch.ones(3, 4), (5, 4), check_invariants=True)
    with SyncCounter() as counter:
        rows, values = triton_rows.gradient_entries(grad)
    assert counter.ops == 5  # _indices, its row, _values and two detaches: views; a sparse_dim query made 6
    assert rows.tolist() == [2, 0, 2] and values.shape == (3, 4)
    assert triton_rows.gradient_entries(grad.to_dense().to_sparse(2)) is None
    assert triton_rows.gradient_entries(torch.zeros(5, 4))[0] is None


def test_a_steps_leaders_take_a_kept_arange_not_a_new_one():
    """The entries' positions that `_leaders` scatters are a view of a kept arange
    (`hostpath.positions`): no arange op a step once one long enough exists."""
    weight = torch.zeros(10, 4)
    grads = [torch.sparse_coo_tensor(torch.tensor([[2, 0, 2, 9]]), torch.ones(4, 4), (10, 4), check_invariants=True),
             torch.sparse_coo_tensor(torch.tensor([[1, 1, 5]]), torch.ones(3, 4), (10, 4), check_invariants=True)]
    names = []

    class Named(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    for grad in grads:
        rows, values = triton_rows.gradient_entries(grad)
        names.clear()
        with Named():  # a table each: no kernel zeroes the kept sums between these calls
            _, lead, summed, _, _ = triton_rows._leaders(rows, values, weight.clone())
        assert "arange" not in names, names
        assert torch.equal(rows.index_select(0, lead), rows)  # every entry's leader is an entry of its row
        assert torch.equal(summed.index_select(0, lead.unique()).sum(0), values.sum(0))


class _Names(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["lazy_adam", "rowwise_adagrad", "ftrl"])
@pytest.mark.parametrize("found", [None, 0.0, 1.0])
def test_a_steps_sums_go_into_kept_zeros_that_the_kernel_zeroes_again(name, found):
    """`_leaders` sums the entries into a kept buffer of zeros (no zeros allocated a step) and the
    kernel stores zeros back where it read a leader's sum -- also where ``found_inf`` skips the
    step --, so the buffer is all zeros after each step and the next step's sums start from zeros
    (the multi-step comparisons with the torch ops above fail on stale sums)."""
    weight = torch.randn(12, 4)
    state = {"lazy_adam": [torch.zeros(12, 4), torch.zeros(12, 4)], "rowwise_adagrad": [torch.full((12,), 0.1)],
             "ftrl": [torch.full((12, 4), 0.1), torch.zeros(12, 4)]}[name]
    flag = None if found is None else torch.tensor([found])
    g = torch.Generator().manual_seed(1)
    for step in range(1, 4):
        rows = torch.randint(0, 6, (10 - step,), generator=g)  # duplicates; fewer entries each step
        values = torch.randn(rows.numel(), 4, generator=g)
        with triton_rows.interpreted(), _Names() as ops:
            if name == "lazy_adam":
                triton_rows.lazy_adam(weight, *state, rows, values, step, 0.05, 0.9, 0.999, 1e-8, found_inf=flag)
            elif name == "rowwise_adagrad":
                triton_rows.rowwise_adagrad(weight, *state, rows, values, 0.1, 1e-10, 0.0, found_inf=flag)
            else:
                triton_rows.ftrl(weight, *state, rows, values, 0.1, -0.5, 0.05, 0.01, found_inf=flag)
        if step > 1:  # the buffer was made for the first step's 9 entries (64 words); later steps view it
            assert not {"new_zeros", "zeros", "zero_", "fill_"} & set(ops.names), ops.names
        buf = triton_rows._zero_buffers[weight]
        assert buf.numel() == 64 and not buf.any(), buf
