"""state_dict / load_state_dict: resuming mid-stream gives the uninterrupted result."""
import io

import numpy as np
import pytest
import torch

from recstream.metrics import AUC, Accuracy, Precision

from .cases import cases

CASES = cases()


def _same(a, b):
    if isinstance(a, (tuple, list)):  # e.g. ROC's (fpr, tpr, thresholds)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    else:
        assert a == pytest.approx(b, abs=1e-12)


@pytest.mark.parametrize("name, factory, batch", CASES, ids=[c[0] for c in CASES])
def test_round_trip_resumes_stream(name, factory, batch):
    full = factory()
    full.update(*batch(1))
    full.update(*batch(2))

    first = factory()
    first.update(*batch(1))
    saved = first.state_dict()
    buffer = io.BytesIO()
    torch.save(saved, buffer)  # checkpoints hold only tensors and plain values
    buffer.seek(0)
    restored_state = torch.load(buffer, weights_only=True)

    first.update(*batch(3))  # mutating the source must not touch the saved copy
    resumed = factory()
    resumed.load_state_dict(restored_state)
    resumed.update(*batch(2))
    _same(resumed.eval(), full.eval())


def test_empty_state_round_trip():
    m = Accuracy()
    m.load_state_dict(Accuracy().state_dict())
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        m.eval()


def test_deferred_errors_survive_round_trip():
    m = Accuracy()
    m.update([0.9, 0.1], [3, 0])
    resumed = Accuracy()
    resumed.load_state_dict(m.state_dict())
    resumed.update([0.9], [1])
    with pytest.raises(ValueError, match="y must be 0 or 1.*first one: 3.0"):
        resumed.eval()


def test_state_contents_are_plain():
    m = Precision()
    m.update([[0.9, 0.1], [0.2, 0.8]], [0, 0])
    state = m.state_dict()
    assert state["layout"] == 2
    assert state["predicted"].tolist() == [1, 1] and state["tp"].tolist() == [1, 0]


def test_bad_states():
    with pytest.raises(TypeError, match=r"Accuracy.load_state_dict: 'state' must be a dict, got \[\] \(list\)"):
        Accuracy().load_state_dict([])
    with pytest.raises(ValueError, match=r"missing \['total'\], unexpected \['bogus'\]"):
        state = Accuracy().state_dict()
        del state["total"]
        state["bogus"] = 1
        Accuracy().load_state_dict(state)
    small = AUC(num_bins=100)
    small.update([0.1, 0.9], [0, 1])
    with pytest.raises(ValueError, match=r"\(num_bins=31745\): state\['hist'\]\['length'\] is 126, expected 63490"):
        AUC(num_bins=2**15).load_state_dict(small.state_dict())
    with pytest.raises(ValueError, match=r"state\['hist'\] must be None, a dict of the non-zero bins or a tensor "
                                         r"of shape \(63490,\) for num_bins=31745.*got \(126,\)"):
        AUC(num_bins=2**15).load_state_dict({**small.state_dict(), "hist": small._hist})  # the dense form
    with pytest.raises(TypeError, match=r"state\['rows'\] must be a list, got int"):
        state = Precision().state_dict()
        state["rows"] = 0
        Precision().load_state_dict(state)
