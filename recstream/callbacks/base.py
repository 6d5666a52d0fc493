"""Callback, CallbackList, RunContext and CallbackParams: how training talks to the outside.

A `Callback` has one method per moment of a run (`on_train_begin` ... `on_eval_end`). The
training loop (`Model._train_loop` in `recstream/train/model.py`) calls them through one
`CallbackList`, which is itself a `Callback` (a composite), so the loop never iterates over
callbacks itself.

Dispatch cost: a `CallbackList` looks, once, at which callbacks actually override each hook and
calls only those; a hook nobody overrides is a call to an empty tuple. That keeps per-step
overhead of an unused hook at a few hundred nanoseconds.

Legacy names, both directions (as in MindSpore 2.x): `on_train_*` and `on_eval_*` fall back to
`begin`, `epoch_begin`, `step_begin`, `step_end`, `epoch_end`, `end`, so callbacks written against
the old API still run; and calling a legacy name on a callback that implements the new hooks (every
built-in one, and a `CallbackList`) runs its `on_train_*` hook, or its `on_eval_*` hook when the
run's ``mode`` is ``"eval"``. A `CallbackList` resolves a member's legacy method directly, so the
fallback costs nothing per step.
"""
from __future__ import annotations

from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

from ..validation import check_type, describe
from .run_state import FIELDS, RunState

# new hook name -> legacy name it falls back to (MindSpore 2.x behaviour, both train and eval).
LEGACY_NAMES = {
    "on_train_begin": "begin",
    "on_train_epoch_begin": "epoch_begin",
    "on_train_step_begin": "step_begin",
    "on_train_step_end": "step_end",
    "on_train_epoch_end": "epoch_end",
    "on_train_end": "end",
    "on_eval_begin": "begin",
    "on_eval_epoch_begin": "epoch_begin",
    "on_eval_step_begin": "step_begin",
    "on_eval_step_end": "step_end",
    "on_eval_epoch_end": "epoch_end",
    "on_eval_end": "end",
}
HOOKS = tuple(LEGACY_NAMES)
# legacy name -> (train hook, eval hook) it runs when called directly.
NEW_NAMES = {legacy: (f"on_train_{legacy}", f"on_eval_{legacy}")
             for legacy in ("begin", "epoch_begin", "step_begin", "step_end", "epoch_end", "end")}


class CallbackParams(dict):
    """The run's shared state as MindSpore's `cb_params`: a dict readable as attributes, and a
    view of the loop's typed `RunState` (`run_state`).

    The run-state fields (``cur_step_num``, ``cur_epoch_num``, ``net_outputs``, ``train_position``
    ... : `recstream.callbacks.run_state.FIELDS`) are read from and written to the `RunState`;
    any other key (the run's network, optimizer, dataset, or a callback's own report such as
    ``published_manifest``) is kept in the dict itself. Missing attributes read as ``None`` (like
    ``.get``), because hooks commonly probe fields that only exist in some modes
    (``cur_epoch_num`` during a standalone ``eval``); a run-state field set to None is missing.

    >>> p = CallbackParams(cur_step_num=3)
    >>> p.cur_step_num, p.get("metrics"), p.cur_epoch_num, p.run_state.step
    (3, None, None, 3)
    >>> p.run_state.step = 4; p["cur_step_num"]
    4
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        object.__setattr__(self, "_state", RunState())
        self.update(*args, **kwargs)

    @classmethod
    def view(cls, state: RunState, **fields) -> CallbackParams:
        """Params showing `state` (the loop's), with `fields` set (on `state` where they are its)."""
        params = cls()
        object.__setattr__(params, "_state", check_type("CallbackParams.view", "state", state, RunState))
        params.update(fields)
        return params

    @property
    def run_state(self) -> RunState:
        """The typed run state this is a view of."""
        return self._state

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):  # keep copy/pickle protocols from seeing None
            raise AttributeError(key)
        attr = FIELDS.get(key)
        if attr is not None:
            return getattr(self._state, attr)
        return dict.get(self, key)

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        self.pop(key, None)

    # --- the dict protocol, over the run state's fields and the dict's own keys -----------------
    def __getitem__(self, key):
        attr = FIELDS.get(key)
        if attr is None:
            return dict.__getitem__(self, key)
        value = getattr(self._state, attr)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        attr = FIELDS.get(key)
        if attr is None:
            dict.__setitem__(self, key, value)
        else:
            setattr(self._state, attr, value)

    def __delitem__(self, key) -> None:
        self[key]  # noqa: B018 - a KeyError for a missing key, as a dict raises
        if key in FIELDS:
            setattr(self._state, FIELDS[key], None)
        else:
            dict.__delitem__(self, key)

    def __contains__(self, key) -> bool:
        attr = FIELDS.get(key)
        return dict.__contains__(self, key) if attr is None else getattr(self._state, attr) is not None

    def __iter__(self):
        state = self._state
        yield from (key for key, attr in FIELDS.items() if getattr(state, attr) is not None)
        yield from dict.__iter__(self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __eq__(self, other) -> bool:
        return isinstance(other, dict) and dict(self.items()) == dict(other.items())

    __hash__ = None

    def __repr__(self) -> str:
        return f"CallbackParams({dict(self.items())!r})"

    def get(self, key, default=None):
        attr = FIELDS.get(key)
        if attr is None:
            return dict.get(self, key, default)
        value = getattr(self._state, attr)
        return default if value is None else value

    def pop(self, key, *default):
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        value = self[key]
        del self[key]
        return value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self.get(key)

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def keys(self):
        return list(self)

    def values(self):
        return [self[key] for key in self]

    def items(self):
        return [(key, self[key]) for key in self]

    def copy(self) -> dict:
        return dict(self.items())

    def clear(self) -> None:
        for attr in FIELDS.values():
            setattr(self._state, attr, None)
        dict.clear(self)


class RunContext:
    """What a hook receives: the run's `CallbackParams` and a way to stop the run.

    >>> ctx = RunContext(CallbackParams())
    >>> ctx.request_stop(); ctx.get_stop_requested()
    True
    """

    def __init__(self, original_args: dict):
        check_type("RunContext", "original_args", original_args, dict)
        self._original_args = original_args
        self._stop_requested = False

    def original_args(self) -> CallbackParams:
        return self._original_args

    @property
    def run_state(self) -> RunState | None:
        """The loop's typed `RunState` (None when the params are a plain dict)."""
        args = self._original_args
        return args.run_state if isinstance(args, CallbackParams) else None

    def request_stop(self) -> None:
        """Ask the loop to stop at its next check (after the current step or epoch)."""
        self._stop_requested = True

    def get_stop_requested(self) -> bool:
        return self._stop_requested


class Callback:
    """Base class: override the hooks you need; each receives a `RunContext`.

    Callbacks are context managers: the loop enters them for the whole run, so a callback can
    open and release resources (files, writers) in ``__enter__`` / ``__exit__``.

    `called_in_fit_eval` (class attribute): whether the evaluation inside ``fit`` calls this
    callback's hooks. True for user callbacks; as in MindSpore, the built-in callbacks set it to
    False (all but `TimeMonitor`), so that e.g. a `ProgressBar` or `History` sees training only.
    A subclass inherits the value of the class it extends and may set its own.

    `rank_zero_only` (class attribute): under several processes (``torchrun``), whether only
    rank 0 runs this callback. True for the callbacks that print, write files or publish (their
    work would be repeated, or collide, on every rank); False by default, so user callbacks run
    on every rank.

    `checkpoint_key` (class attribute): None, or the entry under which `ModelCheckpoint` saves
    this callback's ``state_dict()`` in every checkpoint, for an online run resumed from it to
    hand back with ``load_state_dict`` (`recstream.callbacks.checkpointed`).

    >>> class PrintSteps(Callback):
    ...     def on_train_step_end(self, run_context):
    ...         print("step", run_context.original_args().cur_step_num)
    >>> PrintSteps.called_in_fit_eval
    True
    """

    called_in_fit_eval: bool = True
    rank_zero_only: bool = False
    checkpoint_key: str | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    # Legacy hooks (MindSpore 1.x names). The new hooks below call them when they are overridden;
    # called directly, they run the new hook of the run's mode when that one is overridden.
    def begin(self, run_context):
        """Called once before training or evaluation."""
        self._to_new("begin", run_context)

    def epoch_begin(self, run_context):
        """Called before each epoch."""
        self._to_new("epoch_begin", run_context)

    def step_begin(self, run_context):
        """Called before each step (once per sink in sink mode)."""
        self._to_new("step_begin", run_context)

    def step_end(self, run_context):
        """Called after each step (once per sink in sink mode)."""
        self._to_new("step_end", run_context)

    def epoch_end(self, run_context):
        """Called after each epoch."""
        self._to_new("epoch_end", run_context)

    def end(self, run_context):
        """Called once after training or evaluation."""
        self._to_new("end", run_context)

    def on_train_begin(self, run_context): self._to_legacy("begin", run_context)
    def on_train_epoch_begin(self, run_context): self._to_legacy("epoch_begin", run_context)
    def on_train_step_begin(self, run_context): self._to_legacy("step_begin", run_context)
    def on_train_step_end(self, run_context): self._to_legacy("step_end", run_context)
    def on_train_epoch_end(self, run_context): self._to_legacy("epoch_end", run_context)
    def on_train_end(self, run_context): self._to_legacy("end", run_context)
    def on_eval_begin(self, run_context): self._to_legacy("begin", run_context)
    def on_eval_epoch_begin(self, run_context): self._to_legacy("epoch_begin", run_context)
    def on_eval_step_begin(self, run_context): self._to_legacy("step_begin", run_context)
    def on_eval_step_end(self, run_context): self._to_legacy("step_end", run_context)
    def on_eval_epoch_end(self, run_context): self._to_legacy("epoch_end", run_context)
    def on_eval_end(self, run_context): self._to_legacy("end", run_context)

    # Each direction forwards only to an *overridden* method, so neither can bounce back to the other
    # (an override that calls ``super()`` reaches the base, which then does nothing).
    def _to_legacy(self, legacy: str, run_context) -> None:
        if _own(self, legacy):
            getattr(self, legacy)(run_context)

    def _to_new(self, legacy: str, run_context) -> None:
        train, evaluate = NEW_NAMES[legacy]
        params = run_context.original_args() if isinstance(run_context, RunContext) else {}
        hook = evaluate if params.get("mode") == "eval" else train
        if _own(self, hook):
            getattr(self, hook)(run_context)


def _own(cb: Callback, name: str) -> bool:
    """Whether `cb` defines `name` itself (on its class or as an instance attribute), not `Callback`."""
    fn = getattr(cb, name)
    return getattr(fn, "__func__", fn) is not getattr(Callback, name)


def _overrides(cb: Callback, hook: str) -> bool:
    """True if `cb` does something at `hook`: it overrides the hook or the legacy name behind it
    (on its class or as an instance attribute)."""
    if isinstance(cb, CallbackList):
        return bool(cb._active[hook])
    return _own(cb, hook) or _own(cb, LEGACY_NAMES[hook])


def _resolve(cb: Callback, hook: str):
    """The bound method that does `cb`'s work at `hook`: the hook itself when overridden, else the
    legacy method behind it (skipping the base class's forwarding call)."""
    if isinstance(cb, CallbackList) or _own(cb, hook):
        return getattr(cb, hook)
    return getattr(cb, LEGACY_NAMES[hook])


# The hooks of the phase that follows a step's (the run's) durable checkpoint and commit, and the end
# hook each one takes the place of.
AFTER_COMMIT = {"after_step_commit": "on_train_step_end", "after_train_commit": "on_train_end"}


class Publisher(Callback):
    """A callback that runs after the step's durable checkpoint and its commit: publishing.

    Training on a stream runs, at each step end, position -> durable checkpoint -> commit ->
    publish (`recstream.train.committer`); a `Publisher`'s `after_step_commit` is that last phase,
    and `after_train_commit` the same once the final checkpoint of the run is written and committed.
    The order of the callback list does not matter: whatever comes before or after a publisher in
    it, the run's committer calls it after every other step-end (train-end) callback, after the
    commit, and (several ranks) after the ranks agreed.

    What it sees: the run state of the step just trained (``run_context.run_state``: ``step``,
    ``position``, the batch's metadata); ``checkpoint_step`` / ``checkpoint_position`` /
    ``checkpoint_file`` describe the newest *durable* checkpoint, the one a restart resumes from,
    whose position the source has been told -- the step's own when a checkpoint fell due at it,
    an older one (or None) otherwise. What a publisher reports back (``published_manifest``) the
    other callbacks see from the next step on.

    Where nothing commits (a plain `CallbackList` driven by a loop of one's own), the phase comes
    right after the other callbacks' step (train) end: a `CallbackList` runs its publishers last.

    >>> calls = []
    >>> class Announce(Publisher):
    ...     def after_step_commit(self, ctx): calls.append("publish")
    >>> class Save(Callback):
    ...     def on_train_step_end(self, ctx): calls.append("checkpoint")
    >>> CallbackList([Announce(), Save()]).on_train_step_end(RunContext(CallbackParams())); calls
    ['checkpoint', 'publish']
    """

    def after_step_commit(self, run_context):
        """Called after each step, once its checkpoint (if one fell due) is durable and committed."""

    def after_train_commit(self, run_context):
        """Called once at the end of training, after the final checkpoint and its commit."""

    # A publisher's step and train ends are its after-commit hooks: the phase a list without a
    # committer runs last (`CallbackList`), and what a legacy ``step_end`` / ``end`` call reaches.
    def on_train_step_end(self, run_context): self.after_step_commit(run_context)
    def on_train_end(self, run_context): self.after_train_commit(run_context)


def as_callback_list(callbacks, owner: str = "CallbackList") -> list[Callback]:
    """Normalise ``None`` / one callback / an iterable of callbacks into a list, type-checked.

    `owner` names the function whose ``callbacks`` argument this is, in error messages.
    """
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    if isinstance(callbacks, (str, bytes, dict)) or not isinstance(callbacks, Iterable):
        raise TypeError(f"{owner}: 'callbacks' must be a Callback, a list of Callback or None, "
                        f"got {describe(callbacks)}")
    items = list(callbacks)
    for i, cb in enumerate(items):
        check_type(owner, f"callbacks[{i}]", cb, Callback)
    return items


class CallbackList(Callback):
    """Calls a list of callbacks in order; a `Callback` itself, so lists nest.

    Entering the list enters every member (resources are released in reverse order on exit,
    also when training raises).

    >>> calls = []
    >>> class A(Callback):
    ...     def on_train_begin(self, ctx): calls.append("A")
    >>> cbs = CallbackList([A(), Callback()])
    >>> cbs.on_train_begin(RunContext(CallbackParams())); calls
    ['A']
    """

    def __init__(self, callbacks=None):
        self.callbacks = as_callback_list(callbacks)
        self._stack: ExitStack | None = None
        self._deferred = False  # whether a committer runs the publishers (`defer_publishers`)
        self._index()

    def _index(self) -> None:
        # Resolve, once, the bound methods that do something for each hook. Dispatch then costs
        # one loop over a (usually empty) tuple. Publishers come last at a step's (the run's) end:
        # nothing that runs after them can change what they publish.
        last = {end: () if self._deferred else tuple(_resolve(cb, end) for cb in self._publishers())
                for end in AFTER_COMMIT.values()}
        self._active = {h: tuple(_resolve(cb, h) for cb in self.callbacks
                                 if _overrides(cb, h) and not (h in last and isinstance(cb, Publisher)))
                        + last.get(h, ()) for h in HOOKS}
        self._after = {h: tuple(getattr(cb, h) for cb in self._publishers(nested=True)) for h in AFTER_COMMIT}

    def _publishers(self, nested: bool = False) -> list[Callback]:
        """The members that are publishers (with `nested`: and the member lists holding some)."""
        return [cb for cb in self.callbacks if isinstance(cb, Publisher)
                or nested and isinstance(cb, CallbackList) and any(cb._after.values())]

    def defer_publishers(self) -> None:
        """Leave the publishers to the caller (the run's committer): from now on they no longer run
        at the step's (run's) end, but when the caller calls `after_step_commit` (`after_train_commit`),
        after the commit. Nested lists are deferred too."""
        for cb in self.callbacks:
            if isinstance(cb, CallbackList):
                cb.defer_publishers()
        self._deferred = True
        self._index()

    def after_step_commit(self, run_context) -> None:
        """The publishers' phase of a step, after its checkpoint and commit (see `Publisher`)."""
        for fn in self._after["after_step_commit"]:
            fn(run_context)

    def after_train_commit(self, run_context) -> None:
        """The publishers' phase at the end of training, after the final checkpoint and commit."""
        for fn in self._after["after_train_commit"]:
            fn(run_context)

    def wants(self, hook: str) -> bool:
        """Whether any member does something at `hook` (lets loops skip building hook state)."""
        return bool(self._active[hook])

    def __enter__(self):
        if self._stack is None:
            self._stack = ExitStack().__enter__()
            self.callbacks = [self._stack.enter_context(cb) for cb in self.callbacks]
            self._index()
        return self

    def __exit__(self, *exc_info):
        stack, self._stack = self._stack, None
        return stack.__exit__(*exc_info) if stack is not None else None

    def _call(self, hook: str, run_context) -> None:
        for fn in self._active[hook]:
            fn(run_context)

    # Legacy names called on the list reach every member's legacy method, as MindSpore's callback
    # manager does; a member that implements only the new hooks maps the call to them. The loops
    # never call these, so they need no dispatch table.
    def begin(self, run_context): self._call_legacy("begin", run_context)
    def epoch_begin(self, run_context): self._call_legacy("epoch_begin", run_context)
    def step_begin(self, run_context): self._call_legacy("step_begin", run_context)
    def step_end(self, run_context): self._call_legacy("step_end", run_context)
    def epoch_end(self, run_context): self._call_legacy("epoch_end", run_context)
    def end(self, run_context): self._call_legacy("end", run_context)

    def _call_legacy(self, name: str, run_context) -> None:
        for cb in self.callbacks:
            getattr(cb, name)(run_context)

    def on_train_begin(self, run_context): self._call("on_train_begin", run_context)
    def on_train_epoch_begin(self, run_context): self._call("on_train_epoch_begin", run_context)
    def on_train_step_begin(self, run_context): self._call("on_train_step_begin", run_context)
    def on_train_step_end(self, run_context): self._call("on_train_step_end", run_context)
    def on_train_epoch_end(self, run_context): self._call("on_train_epoch_end", run_context)
    def on_train_end(self, run_context): self._call("on_train_end", run_context)
    def on_eval_begin(self, run_context): self._call("on_eval_begin", run_context)
    def on_eval_epoch_begin(self, run_context): self._call("on_eval_epoch_begin", run_context)
    def on_eval_step_begin(self, run_context): self._call("on_eval_step_begin", run_context)
    def on_eval_step_end(self, run_context): self._call("on_eval_step_end", run_context)
    def on_eval_epoch_end(self, run_context): self._call("on_eval_epoch_end", run_context)
    def on_eval_end(self, run_context): self._call("on_eval_end", run_context)
