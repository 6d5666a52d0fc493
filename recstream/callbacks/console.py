"""`say`: how callbacks print a line, so that it never lands on a progress bar's line.

A line printed while a tqdm bar is drawn on the terminal would be glued to the bar's line and
then overwritten; ``tqdm.write`` clears the bars, writes the line, and redraws them. With no bar
it is an ordinary write: the same text reaches the same stream (stdout unless told otherwise).

>>> say("epoch: 1 step: 10, loss is 0.5")
epoch: 1 step: 10, loss is 0.5
"""
from __future__ import annotations

import sys

from tqdm.auto import tqdm


def say(line: str, file=None) -> None:
    """Write `line` to `file` (default: the current ``sys.stdout``) around any progress bar."""
    out = file if file is not None else sys.stdout
    tqdm.write(line, file=out)
    out.flush()
