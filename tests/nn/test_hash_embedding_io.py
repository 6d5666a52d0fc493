"""HashEmbedding export / incremental export / import and exact state_dict round trip."""

import pytest
import torch

from recstream.nn import HashEmbedding

pytestmark = pytest.mark.usefixtures("hash_kernels")  # every test on the compiled kernels and on torch ops


def k(*keys):
    return torch.tensor(keys, dtype=torch.int64)


def as_map(exported):
    """{key: (values, count, last_seen)} for order-independent comparison."""
    return {int(key): (v.tolist(), int(c), int(s)) for key, v, c, s in zip(
        exported["keys"], exported["values"], exported["counts"], exported["last_seen"], strict=True)}


def busy_module(**kw):
    """A module with admitted, pending and evicted keys, dirty flags and a log."""
    torch.manual_seed(0)
    emb = HashEmbedding(3, permit_filter_value=2, evict_filter_value=3, capacity=6, **kw)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    for step in range(8):
        keys = torch.tensor([step, step, step + 1, 100, 200 + step])
        emb(keys).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 3:
            emb.export()  # baseline: starts the eviction log
    return emb


def test_export_import_round_trip():
    src = busy_module()
    exported = src.export()
    assert exported["keys"].numel() == src.num_rows
    dst = HashEmbedding(3, capacity=16)
    dst.import_(exported)
    assert as_map(dst.export()) == as_map(exported)
    src.eval()
    dst.eval()
    keys = exported["keys"]
    torch.testing.assert_close(dst(keys), src(keys))


def test_export_delta_reports_changed_rows_and_evictions():
    emb = HashEmbedding(2, evict_filter_value=1, capacity=8)
    emb(k(1, 2, 3))
    base = emb.export()
    assert sorted(base["keys"].tolist()) == [1, 2, 3]
    delta = emb.export_delta()
    assert delta["keys"].numel() == 0 and delta["evicted_keys"].numel() == 0
    emb(k(2, 4))  # step 2: 2 touched, 4 new
    emb(k(5))  # step 3: 1 and 3 unseen for 2 steps -> evicted
    with torch.no_grad():
        emb.values[emb.table.rows[emb.table.find(k(4))]] = 7.0
    delta = emb.export_delta()
    assert sorted(delta["keys"].tolist()) == [2, 4, 5]
    assert sorted(delta["evicted_keys"].tolist()) == [1, 3]
    i = delta["keys"].tolist().index(4)
    torch.testing.assert_close(delta["values"][i], torch.tensor([7.0, 7.0]))
    emb(k(1))  # step 4: 1 comes back (new row); 2 and 4 evicted
    delta = emb.export_delta()
    assert delta["keys"].tolist() == [1] and sorted(delta["evicted_keys"].tolist()) == [2, 4]
    emb.eval()
    emb(k(5))  # eval lookups do not dirty rows
    assert emb.export_delta()["keys"].numel() == 0


def test_evicted_then_readmitted_key_is_an_upsert_not_a_delete():
    emb = HashEmbedding(2, capacity=1)
    emb(k(1))
    emb.export()
    emb(k(2))  # evicts 1 (LRU)
    emb(k(1))  # evicts 2, 1 is back
    delta = emb.export_delta()
    assert delta["keys"].tolist() == [1] and delta["evicted_keys"].tolist() == [2]


def test_load_rows_overwrites_admits_and_validates():
    emb = HashEmbedding(2, permit_filter_value=3, capacity=3)
    emb(k(9))  # pending
    emb.values.pop_reset_rows()
    emb.load_rows(k(9, 10), torch.ones(2, 2), counts=k(5, 6))
    assert emb.num_rows == 2 and emb.num_pending == 0
    assert sorted(emb.values.pop_reset_rows().tolist()) == [0, 1]
    emb.load_rows(k(10), torch.full((1, 2), 2.0))  # overwrite keeps the row, count >= permit
    got = as_map(emb.export())
    assert got[10] == ([2.0, 2.0], 6, 1) and got[9][1] == 5  # last_seen = current step
    with pytest.raises(ValueError, match="need 2 new rows but only 1"):
        emb.load_rows(k(11, 12), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"'values' must be a tensor of shape \(1, 2\)"):
        emb.load_rows(k(11), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="unique"):
        emb.load_rows(k(11, 11), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="-2"):
        emb.load_rows(k(-2), torch.zeros(1, 2))
    with pytest.raises(TypeError, match="'exported' must be a mapping"):
        emb.import_([1, 2])


def test_state_dict_round_trip_is_exact():
    src = busy_module()
    sd = src.state_dict()
    assert all(type(v) is torch.Tensor or isinstance(v, torch.nn.Parameter) for v in sd.values())
    assert {"values", "table.keys", "table.counts", "table.last_seen", "row_slots", "free_rows",
            "dirty", "reset_mask", "evicted_keys", "global_step_t", "num_free_t"} <= set(sd)
    assert sd["evicted_keys"].numel() > 0  # the test must cover a non-empty log
    dst = HashEmbedding(3, permit_filter_value=2, evict_filter_value=3, capacity=6)
    dst.load_state_dict(sd)
    for name, tensor in src.state_dict().items():
        assert torch.equal(dst.state_dict()[name], tensor), name
    assert (dst.global_step, dst.num_rows, dst.num_pending) == (src.global_step, src.num_rows,
                                                                src.num_pending)
    # Identical behaviour from here on: same lookups, same admissions, same delta.
    for step in range(3):
        keys = torch.tensor([step, 100, 300, 300, 41 + step])
        torch.manual_seed(step)
        a = src(keys)
        torch.manual_seed(step)
        b = dst(keys)
        torch.testing.assert_close(a, b)
    for x, y in zip(src.export_delta().values(), dst.export_delta().values(), strict=True):
        assert torch.equal(x, y)
    assert torch.equal(src.values.pop_reset_rows(), dst.values.pop_reset_rows())


def test_state_dict_survives_safetensors():
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src = busy_module()
    blob = safetensors_torch.save({n: t.contiguous() for n, t in src.state_dict().items()})
    dst = HashEmbedding(3, permit_filter_value=2, evict_filter_value=3, capacity=6)
    dst.load_state_dict(safetensors_torch.load(blob))
    src.eval()
    dst.eval()
    keys = torch.cat([torch.arange(-6, -2), torch.arange(0, 300)])
    torch.testing.assert_close(dst(keys), src(keys))
