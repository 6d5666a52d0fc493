"""get_metric_fn and get_metrics."""
import pytest

from recstream.metrics import (
    AUC,
    F1,
    MAE,
    MSE,
    Accuracy,
    LogLoss,
    Loss,
    Metric,
    Precision,
    Recall,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    get_metric_fn,
    get_metrics,
)

NAMES = {
    "accuracy": Accuracy,
    "acc": Accuracy,
    "precision": Precision,
    "recall": Recall,
    "F1": F1,
    "f1": F1,
    "auc": AUC,
    "loss": Loss,
    "logloss": LogLoss,
    "mae": MAE,
    "mse": MSE,
    "top_1_accuracy": Top1CategoricalAccuracy,
    "top_5_accuracy": Top5CategoricalAccuracy,
}


@pytest.mark.parametrize("name, cls", NAMES.items())
def test_every_name_builds_its_metric(name, cls):
    metric = get_metric_fn(name)
    assert type(metric) is cls


def test_arguments_are_forwarded():
    assert get_metric_fn("accuracy", "multilabel").eval_type == "multilabel"
    assert get_metric_fn("auc", num_bins=1000, from_logits=True).from_logits is True


def test_unknown_name_lists_known_names():
    # MindSpore: KeyError for an unknown metric name
    with pytest.raises(KeyError, match=r"get_metric_fn: unknown metric name 'roc_auc'; registered names: "
                                       r"\[.*'acc'.*'top_5_accuracy'.*\]"):
        get_metric_fn("roc_auc")
    with pytest.raises(TypeError, match=r"get_metric_fn: 'name' must be a metric name, one of .*got 3 \(int\)"):
        get_metric_fn(3)


def test_get_metrics_from_names_keeps_user_names():
    out = get_metrics({"acc", "F1", "loss"})
    assert set(out) == {"acc", "F1", "loss"}
    assert isinstance(out["acc"], Accuracy) and isinstance(out["F1"], F1)
    assert list(get_metrics(["mse", "mae"])) == ["mse", "mae"]
    assert list(get_metrics(("auc",))) == ["auc"]
    assert get_metrics(None) == {}
    a, b = get_metrics(["acc", "accuracy"]).values()
    assert a is not b  # each name gets its own accumulators


def test_get_metrics_from_dict():
    auc = AUC(num_bins=1000)
    out = get_metrics({"my auc": auc, "acc": Accuracy()})
    assert out["my auc"] is auc and list(out) == ["my auc", "acc"]
    with pytest.raises(TypeError, match=r"get_metrics: 'metrics\['bad'\]' must be a recstream.metrics.Metric or "
                                        r"torchmetrics metric instance, got 'accuracy' \(str\)"):
        get_metrics({"ok": Accuracy(), "bad": "accuracy"})
    with pytest.raises(TypeError, match=r"'metrics\['cls'\]'.*got <class .*Accuracy'> \(ABCMeta\)"):
        get_metrics({"cls": Accuracy})


def test_get_metrics_rejects_other_types():
    with pytest.raises(TypeError, match=r"get_metrics: 'metrics' must be .*got 'acc' \(str\) "
                                        r"\(wrap a single name in a set: \{'acc'\}\)"):
        get_metrics("acc")
    with pytest.raises(TypeError, match=r"got 5 \(int\)"):
        get_metrics(5)
    with pytest.raises(KeyError, match="unknown metric name 'nope'"):
        get_metrics({"acc", "nope"})


def test_custom_metric_subclass_accepted():
    class Count(Metric):
        def clear(self):
            self.n = 0

        def update(self, *inputs):
            self.n += 1

        def eval(self):
            return self.n

    assert isinstance(get_metrics({"count": Count()})["count"], Count)
