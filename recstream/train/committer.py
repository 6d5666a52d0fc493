"""`OnlineCommitter`: the exactly-once protocol of training on a stream, in one place.

A stream reports its position after each batch; a record counts as trained exactly once when a
restart resumes just after the last batch the restored weights hold, and the source (a Kafka
group, a `DirectoryStream`'s commit file) never moves past what a durable checkpoint holds. At
the end of every step, in this order (`OnlineCommitter.on_train_step_end`, top to bottom):

1. **position**: the run state's ``position`` is the one after the last *trained* batch (the
   loop sets it from the step); on several ranks it becomes the job position ``{"step": s,
   "ranks": [...]}`` of every rank (`recstream.distributed.gather_positions`), so whichever rank
   writes the checkpoint records them all;
2. **durable checkpoint**: the step-end callbacks run (all but the publishers): `ModelCheckpoint`
   writes network, optimizer, counters and that position atomically and, once the file is
   durable (written, fsynced, renamed), records it in the run state (``checkpoint_step``,
   ``checkpoint_position``);
3. **commit**: the position of the newest durable checkpoint goes to the source
   (`CommittableDataset.commit`), never a position that no durable checkpoint holds: a crash
   before this replays from the checkpoint's position;
4. **agreement** (several ranks, `recstream.distributed.Lockstep`): one all-reduce makes any
   rank's stop request every rank's, after the same step, and lets a rank whose checkpoint rank 0
   wrote alone (data_parallel) commit its own part of that checkpoint's job position;
5. **publish**: the publishers (`recstream.callbacks.Publisher`, e.g.
   `recstream.serving.ModelPublisher`) run their ``after_step_commit``: a version is never
   visible before the checkpoint of its step (when one fell due at it) is durable and committed.
   They see the run state with ``checkpoint_step`` / ``checkpoint_position`` describing the
   newest durable checkpoint, the one a restart resumes from. (In sink mode on several ranks,
   where an epoch is one sink, the agreement (4) comes right after, at the epoch's end.)

The same happens once more at the end of training: the final checkpoint (2), its commit (3),
the agreement (4), then ``after_train_commit`` (5). The committer wraps the run's `CallbackList`
(the loop calls its hooks as it would the list's) and takes the publishers out of the list's
step and train ends (`CallbackList.defer_publishers`), so the order above does not depend on the
order of the callbacks. Every training run goes through it: with a dataset that takes no commits
(plain offline training) step 3 commits nothing and the publishers still come last.

>>> from recstream.callbacks import Callback, CallbackList, CallbackParams, Publisher, RunContext
>>> class Source(list):  # a committable dataset: commit(position)
...     def commit(self, position): self.append(position)
>>> class Save(Callback):  # what ModelCheckpoint records once its file is durable
...     def on_train_step_end(self, ctx):
...         state = ctx.run_state
...         state.checkpoint_step, state.checkpoint_position = state.step, state.position
>>> class Publish(Publisher):  # what ModelPublisher does at step 5
...     def after_step_commit(self, ctx): print("publish: committed", source)
>>> source = Source()
>>> committer = OnlineCommitter(CallbackList([Publish(), Save()]), source)
>>> params = CallbackParams(cur_step_num=1, train_position={"next": 1})
>>> committer.on_train_step_end(RunContext(params))
publish: committed [{'next': 1}]
>>> committer.on_train_step_end(RunContext(params))  # nothing new is durable: no commit
publish: committed [{'next': 1}]
"""
from __future__ import annotations

from ..callbacks import Callback, CallbackList, RunContext, RunState
from ..data.protocol import CommittableDataset
from ..distributed.lockstep import Lockstep, agree, gather_positions


class OnlineCommitter(Callback):
    """The run's callbacks, with the exactly-once protocol around their step and train ends (see
    the module docstring). `dataset` is the source commits go to (one that is no
    `CommittableDataset` takes none); `lockstep` (several ranks) the rank's `Lockstep` (then also
    `dataset`), `helper` the run's `DatasetHelper`. The publishers of `callbacks` run from now on
    at step 5, no longer at the list's step and train ends."""

    def __init__(self, callbacks: CallbackList, dataset, lockstep: Lockstep | None = None, helper=None):
        self.callbacks, self.lockstep, self.helper = callbacks, lockstep, helper
        callbacks.defer_publishers()  # 5. is this committer's: after the commit
        self._source = dataset if isinstance(dataset, CommittableDataset) else None
        self._committed_step: int | None = None  # the step of the last durable checkpoint committed
        self._job: dict | None = None  # the job position of the last step trained (several ranks)

    # --- the protocol ------------------------------------------------------------------------
    def on_train_step_end(self, run_context: RunContext) -> None:
        state = run_context.run_state
        self._settle_position(state)                    # 1. every rank's position after this step
        self.callbacks.on_train_step_end(run_context)   # 2. a durable checkpoint of it
        self._commit(state)                             # 3. commit what a durable checkpoint holds
        if self.lockstep is not None and not state.sink_mode:
            self._agree(run_context)                    # 4. ranks: stop together; commit own parts
        # (in sink mode an epoch is one sink: the epoch end right after this agrees for both)
        self.callbacks.after_step_commit(run_context)   # 5. publish what is trained, checkpointed, committed

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self.callbacks.on_train_epoch_end(run_context)
        if self.lockstep is not None:  # a stop requested in an epoch hook must be every rank's as well
            self._agree(run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        self.callbacks.on_train_end(run_context)        # the final checkpoint
        self._commit(run_context.run_state)
        if self.lockstep is not None:
            self._agree(None)                           # every rank commits its part of it
        self.callbacks.after_train_commit(run_context)  # the last version, after all of that

    def _settle_position(self, state: RunState) -> None:
        if self.lockstep is not None and state.position is not None:  # a source with positions
            self._job = state.position = gather_positions(state.step, state.position)

    def _commit(self, state: RunState) -> None:
        step = state.checkpoint_step
        if step is None or step == self._committed_step or state.checkpoint_position is None:
            return
        self._committed_step = step
        if self._source is not None:
            self._source.commit(state.checkpoint_position)

    def _agree(self, run_context: RunContext | None) -> None:
        """One all-reduce: stop if any rank asks; commit this rank's part of the newest job position
        a complete checkpoint holds, if this rank did not yet (rank 0 alone wrote it)."""
        lockstep = self.lockstep
        asked = lockstep.stop_wished or (run_context is not None and run_context.get_stop_requested())
        stop, newest = agree(asked, lockstep.durable_step)
        if newest > lockstep.committed_step and self._job is not None and self._job["step"] == newest:
            lockstep.commit_own(self._job)
        if stop and run_context is not None:
            run_context.request_stop()

    # --- the other hooks: the callbacks' ------------------------------------------------------
    def on_train_begin(self, run_context: RunContext) -> None:
        self.callbacks.on_train_begin(run_context)
        if self.lockstep is not None and self.helper is not None:
            # The ranks leave a wait for data together, once a round of `Lockstep` agrees: a stop
            # request of this rank alone must not end its wait (the others would hang in theirs).
            self.helper.should_stop = _never

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        self.callbacks.on_train_epoch_begin(run_context)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        self.callbacks.on_train_step_begin(run_context)

    def on_eval_begin(self, run_context): self.callbacks.on_eval_begin(run_context)
    def on_eval_epoch_begin(self, run_context): self.callbacks.on_eval_epoch_begin(run_context)
    def on_eval_step_begin(self, run_context): self.callbacks.on_eval_step_begin(run_context)
    def on_eval_step_end(self, run_context): self.callbacks.on_eval_step_end(run_context)
    def on_eval_epoch_end(self, run_context): self.callbacks.on_eval_epoch_end(run_context)
    def on_eval_end(self, run_context): self.callbacks.on_eval_end(run_context)


def _never() -> bool:
    return False
