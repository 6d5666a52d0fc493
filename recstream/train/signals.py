"""Stop training cleanly on SIGINT / SIGTERM: the current step finishes, end hooks run.

`StopOnSignal` is a callback: at train begin it installs handlers that only *request* a stop (the
loop checks after each step, and a wait for data is interrupted), so checkpoints are written by
the normal end-of-training path (``cb_params.stop_signal`` holds the signal's number). A second
SIGINT restores the default handler and interrupts at once, an escape hatch for a stuck step.
Handlers are restored when the callback is exited, after every `on_train_end` (so a second
SIGTERM cannot kill the final checkpoint's write).

On several ranks a stop must happen after the same step on every rank (each step and the final
checkpoint are collectives), so there the handler only hands the wish to `on_signal` (the
rank's `recstream.distributed.Lockstep`), and the ranks agree on it at their next step end or
round (see `RecModel.online_train`).

>>> import os, signal
>>> from recstream.callbacks import CallbackParams, RunContext
>>> ctx = RunContext(CallbackParams())
>>> stopper = StopOnSignal(signals=(signal.SIGUSR1,))
>>> stopper.on_train_begin(ctx)
>>> os.kill(os.getpid(), signal.SIGUSR1)  # handled in the main thread: only a stop request
>>> ctx.get_stop_requested(), stopper.received == signal.SIGUSR1, ctx.original_args().stop_signal == signal.SIGUSR1
(True, True, True)
>>> stopper.__exit__(None, None, None)  # the previous handler is back
"""
from __future__ import annotations

import logging
import signal
import threading

from ..callbacks.base import Callback
from ..data.protocol import interrupt

log = logging.getLogger("recstream.train")


class StopOnSignal(Callback):
    """Turn SIGINT/SIGTERM into ``run_context.request_stop()`` for the duration of training."""

    def __init__(self, signals=(signal.SIGINT, signal.SIGTERM), on_signal=None):
        self.signals = tuple(signals)
        self.on_signal = on_signal  # None: request the stop here; else called instead (several ranks)
        self.received: int | None = None
        self._previous: dict = {}
        self._context = None

    def on_train_begin(self, run_context):
        self._context = run_context
        self.received = None
        if threading.current_thread() is not threading.main_thread():
            log.warning("online training runs outside the main thread: SIGINT/SIGTERM cannot be handled there")
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            self._restore()
            raise KeyboardInterrupt  # second Ctrl-C: stop now
        self.received = signum
        # who asked for the stop, for the caller (`recstream online` exits 130/143 after a clean stop)
        self._context.original_args().stop_signal = signum
        log.warning("received %s: finishing the current step, then stopping", signal.Signals(signum).name)
        if self.on_signal is not None:  # several ranks: they stop together, once they agreed
            self.on_signal()
            return
        self._context.request_stop()
        p = self._context.original_args()
        if p.get("dataset_sink_mode") is False:
            # normal mode reads the dataset in this (the main) thread, which may be waiting in an
            # idle source right now: end that wait. In sink mode the channel's wait sees the stop.
            interrupt(p.get("train_dataset"))

    def _restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, *exc_info):
        self._restore()
