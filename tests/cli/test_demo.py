"""`recstream demo` runs the embedded job end to end and learns."""
import re
import time

from recstream.cli.main import main


def test_demo_trains_wide_deep_on_adult(capsys):
    start = time.perf_counter()
    assert main(["demo", "--epochs", "2", "--threads", "1"]) == 0
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    auc = float(re.search(r"epoch 2/2: test auc=([0-9.]+)", out).group(1))
    assert auc > 0.88 and "p(income >50K)" in out
    # one line per epoch (it printed each epoch's results three times: LossMonitor's two lines and a summary)
    assert [line.split(":")[0] for line in out.splitlines() if line.lower().startswith("epoch")] == \
        ["epoch 1/2", "epoch 2/2"], out
    # the time it reports is the command's, not only fit's (it said 5.5 s of a 13.7 s run)
    reported = float(re.search(r"recstream demo: ([0-9.]+) s in all", out).group(1))
    assert abs(reported - seconds) < 0.1 + 0.02 * seconds, (reported, seconds)
