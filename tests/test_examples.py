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
    losses = _load("lenet_custom_loop").main(["--epochs", "4", "--sink-size", "30", "--batches", "30", "--lr", "0.05"])
    out = capsys.readouterr().out
    assert out.count("losses:") == 4 and "epoch: 4/4" in out
    assert losses[-1] < 0.5 * losses[0]
