"""Bad input gets a clear ValueError/TypeError naming the argument and the value."""
import pytest
import torch

from recstream import Model

from .helpers import batches, linear_model

NET = torch.nn.Linear(4, 2)
OPT = torch.optim.SGD(NET.parameters(), lr=0.1)
LOSS = torch.nn.CrossEntropyLoss()

CONSTRUCTOR_CASES = [
    (dict(network="not a module"), TypeError, "'network'"),
    (dict(network=NET, loss_fn=3), TypeError, "'loss_fn'"),
    (dict(network=NET, optimizer="sgd"), TypeError, "'optimizer'"),
    (dict(network=NET, loss_fn=LOSS, optimizer=OPT, amp_level="O4"), ValueError, "'amp_level'.*'O4'"),
    (dict(network=NET, loss_fn=LOSS, amp_level="O2"), ValueError, "'amp_level'.*optimizer=None"),
    (dict(network=NET, loss_fn=LOSS, optimizer=OPT, boost_level="fast"), ValueError, "'boost_level'.*'fast'"),
    (dict(network=NET, loss_fn=LOSS, optimizer=OPT, unknown_kw=1), ValueError, "'unknown_kw'"),
    (dict(network=NET, loss_fn=LOSS, optimizer=OPT, keep_batchnorm_fp32="yes"), TypeError, "'keep_batchnorm_fp32'"),
    (dict(network=NET, loss_fn=LOSS, metrics={"no_such_metric"}), KeyError, "no_such_metric"),  # as MindSpore
    (dict(network=NET, loss_fn=LOSS, metrics={"acc": object()}), TypeError, "acc"),
    (dict(network=NET, metrics={"accuracy"}), ValueError, "'metrics'.*loss_fn"),
    (dict(network=NET, loss_fn=LOSS, eval_network=NET, eval_indexes=[0, 1]), ValueError, "'eval_indexes'.*\\[0, 1\\]"),
    (dict(network=NET, loss_fn=LOSS, eval_indexes="012"), TypeError, "'eval_indexes'"),
    (dict(network=NET, loss_fn=LOSS, eval_indexes=[0, 1, 2.0]), TypeError, "'eval_indexes'"),
    (dict(network=NET, loss_fn=LOSS, amp_level=1), TypeError, "'amp_level'"),
    (dict(network=NET, loss_fn=LOSS, progress_bar=1), TypeError, "'progress_bar'"),
    (dict(network=NET, loss_fn=LOSS, optimizer=OPT, loss_scale_manager=object()), TypeError,
     "'loss_scale_manager'"),
    (dict(network=NET, loss_fn=LOSS, progress_bar="sometimes"), ValueError, "'progress_bar'"),
    (dict(network=NET, loss_scale_manager=object()), ValueError, "'optimizer'.*'loss_scale_manager'"),
]


@pytest.mark.parametrize("kwargs,exc,pattern", CONSTRUCTOR_CASES)
def test_constructor_rejects(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Model(**kwargs)


TRAIN_CASES = [
    (dict(epoch=0), ValueError, "'epoch'.*0"),
    (dict(epoch=2.0), TypeError, "'epoch'.*2.0"),
    (dict(epoch=True), TypeError, "'epoch'"),
    (dict(epoch=2, initial_epoch="1"), TypeError, "'initial_epoch'"),
    (dict(epoch=1, dataset_sink_mode=True, sink_size=True), TypeError, "'sink_size'"),
    (dict(epoch=1, dataset_sink_mode=True, sink_size=1.5), TypeError, "'sink_size'"),
    (dict(epoch=2, initial_epoch=2), ValueError, "'initial_epoch'.*2"),
    (dict(epoch=2, initial_epoch=-1), ValueError, "'initial_epoch'.*-1"),
    (dict(epoch=1, dataset_sink_mode=1), TypeError, "'dataset_sink_mode'"),
    (dict(epoch=1, dataset_sink_mode=True, sink_size=0), ValueError, "'sink_size'.*0"),
    (dict(epoch=1, dataset_sink_mode=True, sink_size=-2), ValueError, "'sink_size'.*-2"),
    (dict(epoch=1, sink_size="all"), TypeError, "'sink_size'"),
    (dict(epoch=1, callbacks=[object()]), TypeError, "'callbacks\\[0\\]'"),
    (dict(epoch=1, callbacks="LossMonitor"), TypeError, "'callbacks'"),
]


@pytest.mark.parametrize("kwargs,exc,pattern", TRAIN_CASES)
def test_train_rejects(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        linear_model().train(train_dataset=batches(1), **kwargs)


@pytest.mark.parametrize("dataset,exc,pattern", [
    (None, ValueError, "'train_dataset'.*None"),
    (torch.zeros(3), TypeError, "'train_dataset'"),
    (42, TypeError, "'train_dataset'.*int"),
    ([torch.randn(4, 4)], ValueError, "'loss_fn'.*'train_dataset'.*1 element"),
    ([{"x": torch.randn(4, 4)}], ValueError, "'label' key.*\\['x'\\]"),
])
def test_train_dataset_rejects(dataset, exc, pattern):
    with pytest.raises(exc, match=pattern):
        linear_model().train(1, dataset)


def test_wrong_arity_in_sink_mode_too():
    with pytest.raises(ValueError, match="'loss_fn'.*1 element"):
        linear_model().train(1, [torch.randn(4, 4)], dataset_sink_mode=True)


@pytest.mark.parametrize("freq,exc", [(0, ValueError), (-1, ValueError), ([], ValueError), ([0], ValueError),
                                      ([1, "2"], TypeError), (1.5, TypeError), (None, TypeError)])
def test_fit_rejects_valid_frequency(freq, exc):
    with pytest.raises(exc, match="'valid_frequency'"):
        linear_model({"accuracy"}).fit(2, batches(1), batches(1), valid_frequency=freq)


def test_fit_with_valid_set_and_no_metrics():
    with pytest.raises(ValueError, match="'valid_dataset'.*metrics"):
        linear_model().fit(1, batches(1), batches(1))


def test_eval_without_metrics():
    with pytest.raises(ValueError, match="metrics"):
        linear_model().eval(batches(1))


def test_eval_wrong_arity():
    with pytest.raises(ValueError, match="'valid_dataset'"):
        linear_model({"accuracy"}).eval([torch.randn(4, 4)])


def test_predict_without_inputs():
    with pytest.raises(ValueError, match="predict"):
        linear_model().predict()
