"""Expected values and exceptions of MindSpore's documented metric behaviour (its own unit tests'
cases): exception types, one-hot labels, top-k label shapes, ROC + auc, confusion matrices,
cosine similarity, names() and rearrange_inputs."""
import math

import numpy as np
import pytest
import torch

from recstream.metrics import (
    F1,
    ROC,
    Accuracy,
    ConfusionMatrix,
    ConfusionMatrixMetric,
    CosineSimilarity,
    Metric,
    Precision,
    Recall,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
    auc,
    get_metric_fn,
    names,
    rearrange_inputs,
)

SCORES = np.array([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])


# ---------------------------------------------------------------- exception types
@pytest.mark.parametrize("cls", [Accuracy, Precision, Recall])
def test_eval_type_of_the_wrong_kind_is_a_type_error(cls):
    with pytest.raises(TypeError, match=rf"{cls.__name__}: 'eval_type' must be one of .*got 'test' \(str\)"):
        cls("test")


def test_unknown_metric_name_is_a_key_error():
    with pytest.raises(KeyError, match="unknown metric name 'top1'"):
        get_metric_fn("top1")


def test_topk_arguments():
    with pytest.raises(TypeError):
        TopKCategoricalAccuracy(2.1)
    with pytest.raises(ValueError):
        TopKCategoricalAccuracy(-1)
    with pytest.raises(ValueError):
        TopKCategoricalAccuracy(3).update(np.ones((3, 5)))
    with pytest.raises(RuntimeError):
        TopKCategoricalAccuracy(3).eval()


# ---------------------------------------------------------------- one-hot labels
def test_one_hot_and_index_labels_agree():
    metric = Accuracy("classification")
    metric.update(SCORES, np.array([1, 0, 1]))
    assert math.isclose(metric.eval(), 2 / 3)
    assert math.isclose(metric(SCORES, np.array([[0, 1], [1, 0], [0, 1]])), 2 / 3)
    metric = Accuracy().set_indexes([0, 2])
    metric.update(SCORES, np.array([1, 0, 1]), np.array([0, 0, 1]))
    assert math.isclose(metric.eval(), 1 / 3)


@pytest.mark.parametrize("labels", [
    [[0.2, 0.8], [1, 0], [0, 1]],  # scores, not one-hot
    [[1, 1], [1, 0], [0, 1]],  # two 1s
    [[0, 0], [1, 0], [0, 1]],  # no 1
])
@pytest.mark.parametrize("factory", [Accuracy, Precision, Recall, F1, lambda: TopKCategoricalAccuracy(1)])
def test_labels_of_the_prediction_shape_must_be_one_hot(factory, labels):
    metric = factory()
    metric.update(SCORES, np.array(labels))  # checked on the device: no read-back in update
    with pytest.raises(ValueError, match=r"must hold 0s and a single 1.*1 value\(s\) that are not, first one: 0"):
        metric.eval()


@pytest.mark.parametrize("y", [np.array([[1, 0, 1], [1, 1, 1]]), np.array(1)])
def test_classification_shape_errors(y):
    with pytest.raises(ValueError):
        Accuracy("classification").update(SCORES, y)


def test_multilabel():
    x = np.array([[0, 1, 0, 1], [1, 0, 1, 1], [0, 0, 0, 1]])
    y = np.array([[0, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    assert Accuracy("multilabel")(x, y) == 1 / 3
    for bad in (y[:2], np.array([0, 1, 1, 1])):
        with pytest.raises(ValueError):
            Accuracy("multilabel").update(x, bad)


def test_topk_accepts_one_hot_of_another_width():
    x = np.array([[0.15, 0.4, 0.1, 0.05, 0., 0.2, 0.1],
                  [0.1, 0.35, 0.25, 0.2, 0.1, 0., 0.],
                  [0., 0.5, 0.2, 0.1, 0.1, 0.1, 0.]])
    one_hot = np.array([[0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]])  # 5 columns for 7 classes
    assert math.isclose(Top5CategoricalAccuracy()(x, np.array([2, 0, 0])), 2 / 3)
    assert math.isclose(Top5CategoricalAccuracy()(x, one_hot), 2 / 3)
    x1 = np.array([[0.2, 0.5, 0.2, 0.1, 0.], [0.1, 0.35, 0.25, 0.2, 0.1], [0.9, 0.1, 0, 0., 0]])
    assert math.isclose(Top1CategoricalAccuracy()(x1, one_hot), 1 / 3)
    assert math.isclose(Top1CategoricalAccuracy()(x1, np.array([[2], [0], [0]])), 1 / 3)  # (N, 1) indices


# ---------------------------------------------------------------- ROC and auc
X3 = np.array([[3, 0, 1], [1, 3, 0], [1, 0, 2]])
Y3 = np.array([[0, 2, 1], [1, 2, 1], [0, 0, 1]])


def test_roc_binary():
    metric = ROC(pos_label=1)
    metric.update(X3, Y3)
    fpr, tpr, thresholds = metric.eval()
    np.testing.assert_array_equal(fpr, [0, 0.4, 0.4, 0.6, 1])
    np.testing.assert_array_equal(tpr, [0, 0, 0.25, 0.75, 1])
    np.testing.assert_array_equal(thresholds, [4, 3, 2, 1, 0])
    assert math.isclose(auc(fpr, tpr), 0.45, abs_tol=0.001)
    metric = ROC(pos_label=2)
    metric.update(X3, Y3)
    assert auc(*metric.eval()[:2]) == pytest.approx(0.5357142857142857)


def test_roc_multiclass_one_vs_rest():
    x = np.array([[0.28, 0.55, 0.15, 0.05], [0.10, 0.20, 0.05, 0.05], [0.20, 0.05, 0.15, 0.05],
                  [0.05, 0.05, 0.05, 0.75]])
    for metric in (ROC(class_num=4), ROC()):  # class_num=None: taken from y_pred
        metric.update(x, np.array([0, 1, 2, 3]))
        fpr, tpr, thresholds = metric.eval()
        np.testing.assert_allclose(fpr[0], [0., 0., 1 / 3, 2 / 3, 1.])
        np.testing.assert_array_equal(tpr[1], [0., 0., 1., 1.])
        np.testing.assert_array_equal(thresholds[2], [1.15, 0.15, 0.05])
        np.testing.assert_array_equal(thresholds[3], [1.75, 0.75, 0.05])


def test_roc_accumulates_batches():
    whole, split = ROC(), ROC()
    whole.update(X3.reshape(-1), Y3.reshape(-1) == 1)
    split.update(X3[:1], Y3[:1] == 1)
    split.update(X3[1:], Y3[1:] == 1)
    for a, b in zip(whole.eval(), split.eval(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_roc_errors():
    x = np.array([[0.2, 0.5, 0.7], [0.3, 0.1, 0.2], [0.9, 0.6, 0.5]])
    with pytest.raises(ValueError):
        ROC().update(x)
    with pytest.raises(ValueError, match="same number of samples, got 3 and 2"):
        ROC().update(x, np.array([1, 0]))
    with pytest.raises(TypeError):
        ROC(pos_label=1.2)
    with pytest.raises(TypeError):
        ROC(class_num="class_num")
    with pytest.raises(RuntimeError):
        ROC().eval()
    with pytest.raises(ValueError, match="'pos_label' must be None"):
        ROC(pos_label=1).update(x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="'class_num' is 2 but"):
        ROC(class_num=2).update(x, np.array([0, 1, 2]))
    only_positives = ROC()
    only_positives.update([0.1, 0.9], [1, 1])
    with pytest.raises(ValueError, match="no negative sample"):
        only_positives.eval()


def test_auc_function():
    assert auc([0, 1], [0, 1]) == 0.5
    assert auc(np.array([1.0, 0.5, 0.0]), np.array([1.0, 1.0, 0.0])) == pytest.approx(0.75)  # decreasing x
    assert auc([0.5, 0.0, 1.0], [1.0, 0.0, 1.0], reorder=True) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="non-decreasing or non-increasing"):
        auc([0.5, 0.0, 1.0], [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="at least 2 points"):
        auc([0.5], [1.0])
    with pytest.raises(ValueError, match="same number of points, got 2 and 3"):
        auc([0, 1], [0, 1, 1])
    with pytest.raises(TypeError, match="'x' must be a numpy.ndarray"):
        auc("01", [0, 1])


# ---------------------------------------------------------------- ConfusionMatrix
def test_confusion_matrix():
    metric = ConfusionMatrix(num_classes=2)
    metric.update(np.array([1, 0, 1, 0]), np.array([1, 0, 0, 1]))
    np.testing.assert_array_equal(metric.eval(), [[1, 1], [1, 1]])
    scores = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7]])  # argmax over axis 1
    np.testing.assert_array_equal(ConfusionMatrix(2)(scores, np.array([0, 0, 1])), [[1, 1], [0, 1]])
    probs, labels = np.array([0.9, 0.2, 0.7, 0.5]), np.array([1, 0, 0, 0])  # float: >= threshold
    np.testing.assert_array_equal(ConfusionMatrix(2)(probs, labels), [[1, 2], [0, 1]])
    np.testing.assert_allclose(ConfusionMatrix(2, "target")(probs, labels), [[1 / 3, 2 / 3], [0, 1]])
    np.testing.assert_allclose(ConfusionMatrix(2, "prediction")(probs, labels), [[1, 2 / 3], [0, 1 / 3]])
    np.testing.assert_allclose(ConfusionMatrix(2, "all")(probs, labels), [[0.25, 0.5], [0, 0.25]])
    np.testing.assert_array_equal(ConfusionMatrix(3, "target")([0, 0], [0, 0]), [[1, 0, 0], [0, 0, 0], [0, 0, 0]])


def test_confusion_matrix_errors():
    x = np.array([[0.2, 0.5, 0.7], [0.3, 0.1, 0.2], [0.9, 0.6, 0.5]])
    with pytest.raises(ValueError):
        ConfusionMatrix(num_classes=2).update(x)
    with pytest.raises(ValueError):
        ConfusionMatrix(num_classes=2).update(x, np.array([1, 0]))
    with pytest.raises(TypeError):
        ConfusionMatrix(num_classes="1")
    with pytest.raises(ValueError):
        ConfusionMatrix(num_classes=2, normalize="wwe")
    with pytest.raises(TypeError):
        ConfusionMatrix(num_classes=2, normalize="no_norm", threshold=1)
    with pytest.raises(RuntimeError):
        ConfusionMatrix(num_classes=2).eval()
    metric = ConfusionMatrix(2)
    metric.update([0, 1], [0, 2])
    with pytest.raises(ValueError, match=r"y must be class indices in \[0, 2\).*first one: 2"):
        metric.eval()


# ---------------------------------------------------------------- ConfusionMatrixMetric
def test_confusion_matrix_metric_values():
    metric = ConfusionMatrixMetric(skip_channel=True, metric_name="tpr", calculation_method=False)
    metric.update(np.array([[[0], [1]], [[1], [0]]]), np.array([[[0], [1]], [[0], [1]]]))
    np.testing.assert_allclose(metric.eval(), [0.5])
    metric.update(np.array([[[0], [1]], [[1], [0]]]), np.array([[[0], [1]], [[1], [0]]]))
    np.testing.assert_allclose(metric.eval(), [0.75])


def test_confusion_matrix_metric_names_and_channels():
    # one click model's thresholded predictions against labels, as (N, 2) one-hot columns
    pred = np.array([[0, 1], [0, 1], [1, 0], [1, 0], [0, 1]])
    truth = np.array([[0, 1], [1, 0], [1, 0], [0, 1], [0, 1]])
    # skip_channel=False leaves out channel 0 (MindSpore's rule), so only the click column counts:
    # tp = 2, fp = 1, tn = 1, fn = 1
    expected = {"precision": 2 / 3, "false positive rate": 1 / 2, "Miss_Rate": 1 / 3, "accuracy": 3 / 5,
                "f1 score": 4 / 6, "specificity": 1 / 2, "mcc": (2 - 1) / math.sqrt(3 * 3 * 2 * 2)}
    for name, value in expected.items():
        metric = ConfusionMatrixMetric(skip_channel=False, metric_name=name)
        metric.update(pred, truth)
        np.testing.assert_allclose(metric.eval(), [value])
    both = ConfusionMatrixMetric(metric_name="precision")  # both columns: tp = 3 of 5 predicted
    both.update(pred, truth)
    np.testing.assert_allclose(both.eval(), [3 / 5])


def test_confusion_matrix_metric_per_sample():
    pred = np.array([[[1, 1, 0, 0], [0, 0, 1, 1]], [[1, 0, 0, 0], [0, 1, 1, 1]]])  # (N=2, C=2, 4 positions)
    truth = np.array([[[1, 0, 0, 0], [0, 1, 1, 1]], [[1, 0, 0, 0], [0, 1, 1, 1]]])
    # per (sample, class) tpr: [[1, 2/3], [1, 1]]
    cases = {"mean": (5 / 6 + 1) / 2, "sum": 1 + 2 / 3 + 2, "mean_batch": [1, 5 / 6], "sum_batch": [2, 5 / 3],
             "mean_channel": [5 / 6, 1], "none": [[1, 2 / 3], [1, 1]]}
    for decrease, expected in cases.items():
        metric = ConfusionMatrixMetric(metric_name="tpr", calculation_method=True, decrease=decrease)
        metric.update(pred, truth)
        np.testing.assert_allclose(metric.eval(), expected)


def test_confusion_matrix_metric_errors():
    x = np.array([[0.2, 0.5, 0.7], [0.3, 0.1, 0.2], [0.9, 0.6, 0.5]])
    with pytest.raises(ValueError):
        ConfusionMatrixMetric(skip_channel=True, metric_name="ppv", calculation_method=True).update(x)
    with pytest.raises(ValueError):
        ConfusionMatrixMetric(skip_channel=True, metric_name="tnr", calculation_method=True).update(
            np.array([1, 0]), x)
    with pytest.raises(TypeError):
        ConfusionMatrixMetric(skip_channel=1)
    with pytest.raises(TypeError):
        ConfusionMatrixMetric(calculation_method=1)
    with pytest.raises(TypeError):
        ConfusionMatrixMetric(metric_name=1)
    with pytest.raises(NotImplementedError):
        ConfusionMatrixMetric(metric_name="wwwww")
    with pytest.raises(ValueError, match="'metric_name' must be one of"):  # also a ValueError (recstream's rule)
        ConfusionMatrixMetric(metric_name="wwwww")
    with pytest.raises(ValueError, match="'decrease'"):
        ConfusionMatrixMetric(decrease="median")
    with pytest.raises(RuntimeError):
        ConfusionMatrixMetric(metric_name="tnr", calculation_method=True).eval()
    metric = ConfusionMatrixMetric()
    metric.update(np.array([[0.3, 0.7]]), np.array([[0, 1]]))
    with pytest.raises(ValueError, match="y_pred must be 0 or 1"):
        metric.eval()


# ---------------------------------------------------------------- CosineSimilarity
DATA = np.array([[5, 8, 3, 2], [5, 8, 3, 2], [4, 2, 3, 4]])


def _reference(data, similarity="cosine"):
    data = data.astype(np.float64)
    if similarity == "cosine":
        data = data / np.linalg.norm(data, axis=1, keepdims=True)
    return data @ data.T


def test_cosine_similarity():
    metric = CosineSimilarity()
    metric.update(DATA)
    np.testing.assert_allclose(metric.eval(), [[0, 1, 0.78229315], [1, 0, 0.78229315], [0.78229315, 0.78229315, 0]])
    full = CosineSimilarity(similarity="cosine", reduction="none", zero_diagonal=False)
    full.update(DATA)
    np.testing.assert_allclose(full.eval(), _reference(DATA))
    dot = CosineSimilarity(similarity="dot", reduction="sum", zero_diagonal=False)
    dot.update(DATA[:2])
    dot.update(torch.tensor(DATA[2:]))  # rows of every update take part
    np.testing.assert_allclose(dot.eval(), _reference(DATA, "dot").sum(axis=-1))
    np.testing.assert_allclose(CosineSimilarity(reduction="mean", zero_diagonal=False)(DATA),
                               _reference(DATA).mean(axis=-1))


def test_cosine_similarity_errors():
    with pytest.raises(ValueError):
        CosineSimilarity(similarity="4")
    with pytest.raises(TypeError):
        CosineSimilarity(similarity=4)
    with pytest.raises(TypeError):
        CosineSimilarity(reduction=2)
    with pytest.raises(ValueError):
        CosineSimilarity(reduction="1")
    with pytest.raises(TypeError):
        CosineSimilarity(zero_diagonal=3)
    with pytest.raises(RuntimeError):
        CosineSimilarity().eval()
    with pytest.raises(ValueError, match=r"\(N, D\) matrix"):
        CosineSimilarity().update(np.ones(3))


# ---------------------------------------------------------------- names, rearrange_inputs
def test_names_lists_mindspore_names_recstream_has():
    listed = names()
    assert listed == sorted(listed)
    for name in ("F1", "acc", "accuracy", "auc", "confusion_matrix", "confusion_matrix_metric", "cosine_similarity",
                 "loss", "mae", "mse", "precision", "recall", "roc", "top_1_accuracy", "top_5_accuracy", "topk"):
        assert name in listed
        if name not in ("confusion_matrix", "topk"):  # those two need an argument
            assert isinstance(get_metric_fn(name), Metric)
    assert isinstance(get_metric_fn("confusion_matrix", 2), ConfusionMatrix)
    assert get_metric_fn("topk", 3).k == 3


def test_rearrange_inputs_on_any_object_with_indexes():
    class Example:  # MindSpore's documented use: any class with an `indexes` property
        def __init__(self):
            self._indexes = None

        @property
        def indexes(self):
            return self._indexes

        def set_indexes(self, indexes):
            self._indexes = indexes
            return self

        @rearrange_inputs
        def update(self, *inputs):
            return inputs

    assert Example().set_indexes([1, 0]).update(5, 9) == (9, 5)
    assert Example().update(5, 9) == (5, 9)


def test_rearrange_inputs_on_a_custom_metric():
    class MeanAbsError(Metric):
        def clear(self):
            self.total, self.count = 0.0, 0

        @rearrange_inputs
        def update(self, *inputs):
            y_pred, y = (np.asarray(v, dtype=np.float64) for v in inputs)
            self.total += np.abs(y_pred - y).sum()
            self.count += y.size

        def eval(self):
            return self.total / self.count

    x = np.array([[0.1, 0.2, 0.6, 0.9], [0.1, 0.2, 0.6, 0.9]])
    y = np.full((2, 4), 0.1)
    y2 = np.array([[0.1, 0.25, 0.7, 0.9], [0.1, 0.25, 0.7, 0.9]])
    metric = MeanAbsError().set_indexes([0, 2])
    metric.clear()
    metric.update(x, y, y2)  # x as prediction, y2 as label
    assert metric.eval() == pytest.approx(0.0375)
    with pytest.raises(ValueError, match=r"indexes \[0, 2\] do not fit the 2 input"):
        metric.update(x, y)


def test_set_indexes_wrong_type_is_a_type_error():
    # MindSpore raises ValueError here; recstream keeps its rule (a wrong type is a TypeError).
    for indexes in (0, [0., 2.], ["1", "0"]):
        with pytest.raises(TypeError):
            Accuracy().set_indexes(indexes)
