"""Two small batches for every built-in metric, shared by the state and no-sync tests."""
import torch

from recstream.metrics import (
    AUC,
    F1,
    MAE,
    MSE,
    ROC,
    Accuracy,
    ConfusionMatrix,
    ConfusionMatrixMetric,
    CosineSimilarity,
    Fbeta,
    LogLoss,
    Loss,
    Precision,
    Recall,
    Top1CategoricalAccuracy,
    TopKCategoricalAccuracy,
)


def _batches(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(16, 4, generator=g)
    classes = torch.randint(0, 4, (16,), generator=g)
    probs = torch.rand(16, generator=g)
    binary = torch.randint(0, 2, (16,), generator=g)
    multilabel = torch.randint(0, 2, (16, 4), generator=g)
    return scores, classes, probs, binary, multilabel


def cases():
    """(name, factory, batch builder) with batch builder(seed) -> update inputs."""

    def cls(seed):
        s, c, *_ = _batches(seed)
        return s, c

    def binary(seed):
        _, _, p, b, _ = _batches(seed)
        return p, b

    def multi(seed):
        s, _, _, _, m = _batches(seed)
        return s, m

    def loss(seed):
        return (_batches(seed)[2],)

    def matrix(seed):
        return (_batches(seed)[0],)

    def zero_one(seed):  # thresholded predictions and labels, class on axis 1
        s, _, _, _, m = _batches(seed)
        return (s > 0.5).long(), m

    return [
        ("accuracy", Accuracy, cls),
        ("accuracy_binary", Accuracy, binary),
        ("accuracy_multilabel", lambda: Accuracy("multilabel"), multi),
        ("precision", Precision, cls),
        ("precision_multilabel", lambda: Precision("multilabel"), multi),
        ("recall_binary", Recall, binary),
        ("fbeta", lambda: Fbeta(2), cls),
        ("f1_binary", F1, binary),
        ("auc", lambda: AUC(num_bins=4096), binary),
        ("auc_logits", lambda: AUC(num_bins=4096, from_logits=True), binary),
        ("logloss", LogLoss, binary),
        ("loss", Loss, loss),
        ("mae", MAE, multi),
        ("mse", MSE, multi),
        ("topk", lambda: TopKCategoricalAccuracy(2), cls),
        ("top1", Top1CategoricalAccuracy, cls),
        ("roc_binary", ROC, binary),
        ("confusion_matrix", lambda: ConfusionMatrix(4), cls),
        ("confusion_matrix_normalized", lambda: ConfusionMatrix(2, normalize="target"), binary),
        ("confusion_matrix_metric", lambda: ConfusionMatrixMetric(metric_name="fpr"), zero_one),
        ("confusion_matrix_metric_per_sample",
         lambda: ConfusionMatrixMetric(metric_name="f1", calculation_method=True, decrease="mean_batch"), zero_one),
        ("cosine_similarity", CosineSimilarity, matrix),
    ]
