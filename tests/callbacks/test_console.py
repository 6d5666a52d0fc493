"""Lines printed by callbacks while a progress bar is drawn start on a line of their own."""
import io
import re
import sys

import torch

from recstream import Model
from recstream.callbacks import LossMonitor


def test_loss_lines_do_not_land_on_the_progress_bars_line(monkeypatch):
    terminal = io.StringIO()  # stdout and stderr interleaved, as on a real terminal
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    net = torch.nn.Linear(2, 1)
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(6)]
    model = Model(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=True)
    model.train(1, data, callbacks=[LossMonitor(2)])
    text = terminal.getvalue()
    starts = [m.start() for m in re.finditer(r"epoch: 1 step: \d, loss is", text)]
    assert len(starts) == 3
    # each line begins at a line start: after a newline or after the bar was cleared with '\r'
    assert all(text[i - 1] in "\r\n" for i in starts), [text[max(0, i - 20):i] for i in starts]
