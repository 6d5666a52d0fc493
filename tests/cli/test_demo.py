"""`recstream demo` runs the embedded job end to end and learns."""
import re

from recstream.cli.main import main


def test_demo_trains_wide_deep_on_adult(capsys):
    assert main(["demo", "--epochs", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    auc = float(re.search(r"epoch 1: test auc=([0-9.]+)", out).group(1))
    assert auc > 0.88 and "p(income >50K)" in out
