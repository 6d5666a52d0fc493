"""The examples run and learn."""
import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lenet_custom_loop_learns(capsys):
    losses = _load("lenet_custom_loop").main(["--epochs", "4", "--sink-size", "30", "--batches", "30"])
    out = capsys.readouterr().out
    assert out.count("losses:") == 4 and "epoch: 4/4" in out
    assert losses[-1] < 0.5 * losses[0]


def test_online_training_example_serves_a_trained_version(tmp_path):
    online = _load("online_training")
    answer = online.main(["--seconds", "4", "--rate", "3000", "--workdir", str(tmp_path)])
    assert answer["version"] >= 1 and 0.0 < answer["scores"][0] < 1.0
    again = online.main(["--seconds", "2", "--rate", "3000", "--workdir", str(tmp_path)])  # resumes
    assert again["version"] > answer["version"]
