"""``update`` never reads values back from the device.

Two independent checks:

* meta tensors carry shapes and dtypes but no data, so any read-back in ``update``
  (``.item()``, ``bool(t)``, ``.cpu()``, boolean-mask indexing, ``nonzero``, CUDA's
  data-dependent ``bincount``...) raises there;
* on CPU tensors, the Python-level read-back methods are patched to raise.
"""
import numpy as np
import pytest
import torch

from .cases import cases

CASES = cases()
READ_BACKS = ["item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"]


def _to_meta(inputs):
    return tuple(t.to("meta") for t in inputs)


@pytest.mark.parametrize("name, factory, batch", CASES, ids=[c[0] for c in CASES])
def test_update_runs_on_meta_tensors(name, factory, batch):
    metric = factory()
    metric.update(*_to_meta(batch(1)))
    metric.update(*_to_meta(batch(2)))
    # the accumulators stay on the inputs' device
    tensors = [v for v in metric.state_dict().values() if isinstance(v, torch.Tensor)]
    tensors += [t for v in metric.state_dict().values() if isinstance(v, list) for t in v]
    assert tensors
    assert all(t.is_meta for t in tensors)


@pytest.mark.parametrize("name, factory, batch", CASES, ids=[c[0] for c in CASES])
def test_update_calls_no_read_back(monkeypatch, name, factory, batch):
    reference = factory()
    reference.update(*batch(1))
    reference.update(*batch(2))

    metric = factory()
    with monkeypatch.context() as patch:
        for method in READ_BACKS:
            def fail(*args, _method=method, **kwargs):
                raise AssertionError(f"update() called Tensor.{_method}")

            patch.setattr(torch.Tensor, method, fail)
        with pytest.raises(AssertionError, match=r"called Tensor.item"):
            torch.ones(1).item()  # the patch is active
        metric.update(*batch(1))
        metric.update(*batch(2))
    result, expected = metric.eval(), reference.eval()  # eval may read back
    np.testing.assert_allclose(result, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name, factory, batch", CASES, ids=[c[0] for c in CASES])
def test_update_does_not_synchronize_cuda(name, factory, batch):
    metric = factory()
    inputs = tuple(t.cuda() for t in batch(1))
    metric.update(*inputs)  # first call may allocate
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        metric.update(*inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
