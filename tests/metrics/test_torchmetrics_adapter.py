"""torchmetrics objects in Model(metrics=...): wrapped, fed like recstream's own, same results."""
import pytest
import torch
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC
from torchmetrics.regression import MeanSquaredError

from recstream import Model
from recstream.metrics import AUC, get_metrics
from recstream.metrics.torchmetrics_adapter import TorchMetric


def test_model_eval_with_torchmetrics_matches_recstreams_own_auc():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0), torch.nn.Sigmoid())
    data = [(torch.randn(32, 3), torch.randint(0, 2, (32,)).float()) for _ in range(4)]
    model = Model(net, torch.nn.BCELoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                  metrics={"tm_auc": BinaryAUROC(), "tm_acc": BinaryAccuracy(), "auc": AUC()})
    result = model.eval(data)
    assert result["tm_auc"] == pytest.approx(result["auc"], abs=1e-6)
    assert 0.0 <= result["tm_acc"] <= 1.0
    again = model.eval(data)  # cleared between evaluations, not accumulated
    assert again["tm_auc"] == pytest.approx(result["tm_auc"])


def test_regression_metrics_keep_float_targets_and_errors_name_the_entry():
    m = get_metrics({"mse": MeanSquaredError()})["mse"]
    assert isinstance(m, TorchMetric)
    m.clear()
    m.update(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]))
    assert m.eval() == pytest.approx(0.125)
    with pytest.raises(TypeError, match=r"'metrics\['x'\]' must be a recstream.metrics.Metric or torchmetrics metric"):
        get_metrics({"x": object()})
    with pytest.raises(TypeError, match="must be a torchmetrics metric"):
        TorchMetric(AUC())
