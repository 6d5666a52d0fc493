"""MLflowLogger against a real local MLflow tracking store (sqlite in tmp_path; no server, no mocks)."""
import shutil
import subprocess
import sys

import pytest
import torch

mlflow = pytest.importorskip("mlflow")

from recstream import Model  # noqa: E402
from recstream.callbacks import Callback, MLflowLogger, PrequentialMonitor, load_checkpoint, save_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def _template_db(tmp_path_factory):
    # A new sqlite store runs MLflow's schema migrations (seconds): do it once, copy the file per test.
    path = tmp_path_factory.mktemp("mlflow") / "template.db"
    mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def uri(tmp_path, _template_db):
    shutil.copy(_template_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _data(n=4, batch=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(batch, 4, generator=g)
        out.append((x, (x[:, :1] > 0).float()))
    return out


def _model(metrics=None, lr=0.05):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Sigmoid())  # probabilities, as AUC wants
    return Model(net, torch.nn.BCELoss(), torch.optim.Adam(net.parameters(), lr=lr),
                 metrics=metrics, progress_bar=False)


def _history(logger, key):
    return [(m.step, m.value) for m in logger.client.get_metric_history(logger.run_id, key)]


def _run(logger):
    return logger.client.get_run(logger.run_id)


def test_fit_logs_loss_lr_eval_metrics_and_params(uri):
    model = _model(metrics={"auc", "loss"})
    logger = MLflowLogger(tracking_uri=uri, experiment_name="ctr", run_name="first", log_every_n_steps=2,
                          tags={"team": "ads"}, params={"amp_level": "O0"})
    history = model.fit(2, _data(), valid_dataset=_data(seed=1), callbacks=[logger])
    run = _run(logger)
    assert run.info.status == "FINISHED" and run.info.run_name == "first" and run.data.tags["team"] == "ads"
    assert logger.client.get_experiment(run.info.experiment_id).name == "ctr"
    params = run.data.params
    assert {k: params[k] for k in ("network", "loss_fn", "optimizer", "optimizer/lr", "optimizer/betas",
                                   "epoch_num", "batch_num", "batch_size", "amp_level")} == {
        "network": "Sequential", "loss_fn": "BCELoss", "optimizer": "Adam", "optimizer/lr": "0.05",
        "optimizer/betas": "(0.9, 0.999)", "epoch_num": "2", "batch_num": "4", "batch_size": "8", "amp_level": "O0"}
    assert "optimizer/foreach" not in params  # switches are not hyperparameters
    assert [s for s, _ in _history(logger, "train/loss")] == [2, 4, 6, 8]
    assert _history(logger, "train/lr") == [(2, 0.05), (4, 0.05), (6, 0.05), (8, 0.05)]
    # fit's eval_loss and the "loss" metric keep separate keys, at the step of the epoch's end
    for key, values in (("eval/loss", history.history["loss"]), ("eval/eval_loss", history.history["eval_loss"]),
                        ("eval/auc", history.history["auc"])):
        assert _history(logger, key) == [(4, pytest.approx(values[0])), (8, pytest.approx(values[1]))]
    # the last logged training loss is the one History recorded for epoch 2
    assert _history(logger, "train/loss")[-1][1] == pytest.approx(history.history["net_output"][-1], rel=1e-6)


def test_restored_checkpoint_continues_the_same_run_and_step_axis(uri, tmp_path):
    model = _model()
    first = MLflowLogger(tracking_uri=uri, experiment_name="resume", log_every_n_steps=2)
    model.train(1, _data(), callbacks=[first])
    path = save_checkpoint(tmp_path / "ckpt.safetensors", model.train_network, extra={"mlflow": first.state_dict()})
    assert _run(first).info.status == "FINISHED"

    restored = _model()  # a new process would build everything anew
    meta = load_checkpoint(path, restored.train_network, restore_rng=False)
    second = MLflowLogger(tracking_uri=uri, experiment_name="resume", log_every_n_steps=2)
    second.load_state_dict(meta["mlflow"])
    restored.train(3, _data(), callbacks=[second], initial_epoch=1)

    assert second.run_id == first.run_id
    runs = second.client.search_runs([_run(first).info.experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]
    assert [s for s, _ in _history(second, "train/loss")] == [2, 4, 6, 8, 10, 12]  # no step counted twice
    assert _run(second).info.status == "FINISHED"
    assert _run(second).data.params["epoch_num"] == "1"  # MLflow params are immutable: the first value stays

    third = MLflowLogger(tracking_uri=uri, run_id=first.run_id, log_every_n_steps=4)  # the run id given directly
    _model().train(1, _data(), callbacks=[third])
    assert [s for s, _ in _history(third, "train/loss")][-1] == 4  # a new logger: its own axis, same run
    assert len(second.client.search_runs([_run(first).info.experiment_id])) == 1


def test_unknown_run_id_fails_before_training(uri):
    logger = MLflowLogger(tracking_uri=uri, run_id="0123456789abcdef0123456789abcdef")
    with pytest.raises(ValueError, match="run_id '0123456789abcdef0123456789abcdef' is not a run"):
        _model().train(1, _data(), callbacks=[logger])


class _Boom(Callback):
    def __init__(self, at, exc):
        self.at, self.exc = at, exc

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.at:
            raise self.exc


@pytest.mark.parametrize("exc, status", [(RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_training_that_raises_ends_the_run_with_its_status(uri, exc, status):
    logger = MLflowLogger(tracking_uri=uri, log_every_n_steps=2)
    with pytest.raises(type(exc)):
        _model().train(2, _data(), callbacks=[logger, _Boom(5, exc)])
    assert _run(logger).info.status == status
    assert [s for s, _ in _history(logger, "train/loss")] == [2, 4]


def test_active_run_of_a_with_block_is_used_and_left_to_it(uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with mlflow.start_run() as active:
        mlflow.log_param("optimizer", "mine")  # the user's own value of a key the logger also logs
        logger = MLflowLogger(log_every_n_steps=4)
        _model().train(1, _data(), callbacks=[logger])
        assert logger.run_id == active.info.run_id
        params = _run(logger).data.params
        assert params["optimizer"] == "mine" and params["batch_size"] == "8"
        assert _run(logger).info.status == "RUNNING"  # the with block ends it, not the logger
    assert _run(logger).info.status == "FINISHED"
    assert _history(logger, "train/loss")[0][0] == 4


def test_two_models_in_one_process_keep_their_own_runs(uri):
    a, b = _model(lr=0.1), _model(lr=0.2)
    log_a = MLflowLogger(tracking_uri=uri, experiment_name="a", log_every_n_steps=4)
    log_b = MLflowLogger(tracking_uri=uri, experiment_name="b", log_every_n_steps=4)
    a.train(1, _data(), callbacks=[log_a])
    b.train(1, _data(), callbacks=[log_b])
    a.train(1, _data(), callbacks=[log_a])  # the same logger: the same run, steps go on
    assert log_a.run_id != log_b.run_id
    assert _history(log_a, "train/lr") == [(4, 0.1), (8, 0.1)]
    assert _history(log_b, "train/lr") == [(4, 0.2)]


def test_epoch_frequency_lr_groups_and_standalone_eval(uri, driver, ctx_of):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(2)]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "lr": 0.2}])
    logger = MLflowLogger(tracking_uri=uri, log_every_n_steps="epoch")
    with pytest.warns(RuntimeWarning, match="skipping non-scalar result 'curve'"):
        driver([logger], optimizer=opt, batch_num=2, epoch_num=2).run(
            losses=[[0.9, 0.8], [0.7, 0.6]], eval_results={2: {"auc": 0.7, "eval_loss": 0.65, "curve": [1, 2]}})
    logger.on_eval_end(ctx_of(metrics={"acc": 0.9}))  # a standalone eval after training
    hist = lambda key: [(s, round(v, 6)) for s, v in _history(logger, key)]  # noqa: E731
    assert hist("train/loss") == [(2, 0.8), (4, 0.6)]
    assert hist("train/lr/group0") == [(2, 0.1), (4, 0.1)] and hist("train/lr/group1") == [(2, 0.2), (4, 0.2)]
    assert hist("eval/auc") == [(4, 0.7)] and hist("eval/eval_loss") == [(4, 0.65)] and hist("eval/acc") == [(4, 0.9)]
    assert "eval/curve" not in _run(logger).data.metrics  # not a scalar: skipped
    assert _run(logger).data.params["optimizer/group1/lr"] == "0.2"


def test_prequential_reports_are_logged(uri):
    model = _model()
    monitor = PrequentialMonitor(window=64, log_every=2, output="probabilities", verbose=False)
    logger = MLflowLogger(tracking_uri=uri, log_every_n_steps=100)
    model.train(1, _data(n=5), callbacks=[monitor, logger])
    logloss = _history(logger, "prequential/logloss")
    assert [s for s, _ in logloss] == [2, 4, 5]  # every 2 batches, and the final report
    assert logloss[-1][1] == pytest.approx(monitor.last["logloss"])
    assert _history(logger, "prequential/auc")[-1][1] == pytest.approx(monitor.last["auc"])
    assert "train/loss" not in _run(logger).data.metrics  # 100 steps never passed


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="MLflowLogger: 'tracking_uri' must be a non-empty str or None, got 5"):
        MLflowLogger(tracking_uri=5)
    with pytest.raises(ValueError, match="'experiment_name' must be a non-empty str or None, got ''"):
        MLflowLogger(experiment_name="")
    with pytest.raises(TypeError, match="'run_id'"):
        MLflowLogger(run_id=123)
    with pytest.raises(ValueError, match=r"'log_every_n_steps' must be an int >= 1, got 0"):
        MLflowLogger(log_every_n_steps=0)
    with pytest.raises(ValueError, match=r"'log_every_n_steps' must be one of \['epoch'\], got 'batch'"):
        MLflowLogger(log_every_n_steps="batch")
    with pytest.raises(TypeError, match="'log_every_n_steps'"):
        MLflowLogger(log_every_n_steps=True)
    with pytest.raises(TypeError, match="'log_params' must be a bool"):
        MLflowLogger(log_params="yes")
    with pytest.raises(TypeError, match="'tags'"):
        MLflowLogger(tags=[("team", "ads")])
    with pytest.raises(TypeError, match=r"'tags\['team'\]' must be a str, int, float or bool"):
        MLflowLogger(tags={"team": ["ads"]})
    with pytest.raises(TypeError, match="the keys of 'params' must be non-empty str"):
        MLflowLogger(params={1: "x"})
    logger = MLflowLogger()
    with pytest.raises(TypeError, match="MLflowLogger.load_state_dict: 'state' must be a dict"):
        logger.load_state_dict("abc")
    with pytest.raises(ValueError, match=r"keys \['run_id', 'step'\].*got \['run'\]"):
        logger.load_state_dict({"run": "x"})
    with pytest.raises(ValueError, match=r"'state\['step'\]' must be an int >= 0, got -1"):
        logger.load_state_dict({"run_id": "x", "step": -1})


MISSING = """
import sys
import recstream, recstream.callbacks, recstream.train
from recstream import Model
assert "mlflow" not in sys.modules, "importing recstream imported mlflow"
sys.modules["mlflow"] = None  # as if the extra were not installed
try:
    recstream.callbacks.MLflowLogger()
except ImportError as e:
    print("ERR1", e)
"""


def test_missing_mlflow_names_the_extra_and_importing_recstream_does_not_import_it(tmp_path):
    out = subprocess.run([sys.executable, "-c", MISSING], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert ("ERR1 recstream.callbacks.MLflowLogger needs the MLflow client: pip install 'recstream[mlflow]'"
            in out.stdout)


def test_sqlite_store_without_sqlalchemy_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # mlflow-skinny alone
    logger = MLflowLogger(tracking_uri=f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(ImportError, match=r"tracking store 'sqlite:///.*x.db' needs SQLAlchemy and Alembic.*"
                                          r"pip install 'recstream\[mlflow\]'"):
        _ = logger.client
    assert not (tmp_path / "x.db").exists()
