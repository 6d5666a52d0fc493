"""The step-end halves of online training on several ranks (`RecModel.online_train` under ``torchrun``).

`recstream.distributed.Lockstep` keeps the ranks' batches in step; these two callbacks keep their
decisions in step, in the main thread, at the end of each step:

- `PositionSync` runs FIRST among the callbacks: it gathers every rank's stream position into the
  job position ``{"step": s, "ranks": [...]}`` and puts it in ``cb_params.train_position``, so the
  checkpoint written at this step (by rank 0 alone under data_parallel, by every rank under
  hybrid_parallel) holds every rank's position. It also makes the loop's wait for data ignore a
  stop request of this rank alone: the ranks must leave that wait together, and do, once a
  round of `Lockstep` agrees.
- `StopAgreement` runs LAST, after every other callback had its say (at each step end, and at
  each epoch end: in sink mode, where an epoch is one sink, only there): any rank's stop request
  (a callback's ``request_stop()``, a signal) becomes every rank's, so all ranks leave the loop
  after the same step and write the same final checkpoint; and a checkpoint that rank 0 alone
  completed (data_parallel) lets every other rank commit its own part of the positions now.
"""
from __future__ import annotations

from ..callbacks import Callback
from ..distributed.lockstep import Lockstep, agree, gather_positions


class PositionSync(Callback):
    """Every rank's position into ``cb_params.train_position`` at each step end (see the module docstring)."""

    def __init__(self, lockstep: Lockstep, helper):
        self.lockstep, self.helper = lockstep, helper
        self.last_job: dict | None = None  # the job position of the last step trained

    def on_train_begin(self, run_context):
        self.helper.should_stop = _never  # see the module docstring

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        if p.get("train_position") is None:  # a source without positions: nothing to gather
            return
        self.last_job = gather_positions(p.cur_step_num, p.train_position)
        p.train_position = self.last_job


class StopAgreement(Callback):
    """Any rank's stop is every rank's, after the same step; commits follow a complete checkpoint."""

    def __init__(self, lockstep: Lockstep, positions: PositionSync):
        self.lockstep, self.positions = lockstep, positions

    def on_train_step_end(self, run_context):
        # In sink mode an epoch is one sink: the epoch end right after this agrees for both (a rank
        # that leaves its one-step epoch early on a stop of its own still reaches that epoch end).
        if not run_context.original_args().dataset_sink_mode:
            self.agree(run_context)

    def on_train_epoch_end(self, run_context):
        self.agree(run_context)  # a stop requested in an epoch hook must be every rank's as well

    def agree(self, run_context=None) -> None:
        """One all-reduce: stop if any rank asks; commit this rank's part of the newest job position
        a complete checkpoint holds, if this rank did not yet. Also called once after training
        (`run_context` None), after the final checkpoint."""
        asked = self.lockstep.stop_wished or (run_context is not None and run_context.get_stop_requested())
        stop, newest = agree(asked, self.lockstep.durable_step)
        job = self.positions.last_job
        if newest > self.lockstep.committed_step and job is not None and job["step"] == newest:
            self.lockstep.commit_own(job)
        if stop and run_context is not None:
            run_context.request_stop()


def _never() -> bool:
    return False
