"""Dynamic micro-batching: concurrent ``/predict`` requests share one forward pass.

A forward of a small CTR network costs about the same for 1 row as for 100: the per-call
overhead (Python, operator dispatch, Arrow conversion) dominates. So, as Triton's dynamic
batcher does, requests that arrive together are coalesced:

* each request's instances are queued with a future (its own slot);
* one dispatcher task (on the server's event loop) takes the queued requests, up to
  ``max_batch_rows`` rows in all (a larger request runs alone), and hands them to a worker
  thread, which validates each request on its own (a bad one gets its own 400, the others
  go on), converts all rows at once, runs ONE forward under ``torch.inference_mode`` on the
  version served at that moment, and splits the scores back by request;
* while a batch runs, newly arriving requests queue up for the next one, so batches grow
  with the load by themselves; when requests are still being received (their body not
  read yet) the dispatcher waits at most ``max_wait`` seconds for them before starting,
  and never waits when nobody else is coming (one client pays no batching delay).

Every request of a batch is answered by that batch's version (``version`` in each answer).
At most ``max_queued_rows`` rows may wait: beyond that a request is refused at once (503,
``overloaded``) instead of queueing without bound.

>>> import asyncio, tempfile
>>> from recstream.data import Schema, CategoricalFeature
>>> from recstream.models import WideDeep
>>> from recstream.serving import ModelHolder, publish_version
>>> schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
>>> d = tempfile.mkdtemp()
>>> _ = publish_version(d, WideDeep(schema, hidden=(8,)), model_config={"hidden": [8]})
>>> holder = ModelHolder(d); _ = holder.refresh()
>>> async def two_requests():
...     batcher = MicroBatcher(holder, max_wait=0.01)
...     try:
...         return await asyncio.gather(batcher.predict([{"x": 1.0, "c": 2}]),
...                                     batcher.predict([{"x": 0.0, "c": 1}, {"x": 2.0, "c": 4}]))
...     finally:
...         batcher.close()
>>> [(len(scores), version) for scores, version in asyncio.run(two_requests())]
[(1, 1), (2, 1)]
"""
from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ...validation import check_int, check_number, check_type
from .model_holder import ModelHolder, Served
from .request import RequestError

log = logging.getLogger(__name__)


@dataclass
class _Job:
    instances: list
    future: asyncio.Future
    rows: int = field(init=False)

    def __post_init__(self):
        self.rows = len(self.instances)


def _scores(served: Served, features) -> list[float]:
    with torch.inference_mode():
        out = served.model(features).reshape(-1).float()
        if (served.manifest.get("model") or {}).get("output", "logits") == "logits":
            out = torch.sigmoid(out)
    if out.numel() != features.batch_size:
        raise RuntimeError(f"network returned {out.numel()} scores for {features.batch_size} instances")
    return out.tolist()


def run_batch(served: Served | None, jobs: list) -> list:
    """Per job: ``(scores, version)`` or a RequestError; ONE forward for all good jobs."""
    if served is None:
        return [RequestError(503, "no model version loaded yet")] * len(jobs)
    results: list = [None] * len(jobs)
    parts, owners = [], []
    for i, job in enumerate(jobs):
        try:
            parts.append(served.parser.columns(job.instances))
            owners.append(i)
        except RequestError as e:
            results[i] = e
    if not parts:
        return results
    features, errors = served.parser.convert(parts)
    scores = _scores(served, features)  # rows of rejected parts are not in `features`
    start = 0
    for i, part_error in zip(owners, errors, strict=True):
        if part_error is not None:
            results[i] = part_error
            continue
        n = jobs[i].rows
        results[i] = _checked(scores[start:start + n], served.version)
        start += n
    return results


def _checked(scores: list[float], version: int):
    """``(scores, version)``, or a JSON-able 500 if the model's scores are not finite (a version
    with non-finite weights): the body names the problem instead of failing to encode NaN."""
    bad = [j for j, s in enumerate(scores) if not math.isfinite(s)]
    if not bad:
        return scores, version
    log.error("version %s produced non-finite scores for %d of %d instances", version, len(bad), len(scores))
    return RequestError(500, f"the model (version {version}) produced non-finite scores (NaN or inf) for "
                             f"{len(bad)} of {len(scores)} instances; this version cannot serve",
                        reason="non_finite_output", version=version, instances=bad[:10])


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(RequestError(503, "deadline exceeded: no answer within the request timeout; retry later",
                                       retry_after=1))


class MicroBatcher:
    """Coalesces concurrent predictions into shared forward passes (see module docstring).

    Args:
        holder: serves ``holder.current`` (read once per batch).
        max_batch_rows: most instances per forward (a larger single request runs alone).
        max_wait: seconds a batch may wait for requests still being received (0: never wait).
        max_queued_rows: most instances waiting; beyond, requests get 503 ``overloaded``.
        on_batch: optional ``callable(rows)`` told each forward's size (metrics).
    """

    def __init__(self, holder: ModelHolder, max_batch_rows: int = 256, max_wait: float = 0.002,
                 max_queued_rows: int = 65536, on_batch=None):
        owner = "MicroBatcher"
        self.holder = check_type(owner, "holder", holder, ModelHolder)
        self.max_batch_rows = check_int(owner, "max_batch_rows", max_batch_rows, minimum=1)
        self.max_wait = check_number(owner, "max_wait", max_wait, minimum=0)
        self.max_queued_rows = check_int(owner, "max_queued_rows", max_queued_rows, minimum=1)
        self.on_batch = on_batch
        self.arriving = 0  # requests being received: the only ones worth waiting for
        self._queue: collections.deque[_Job] = collections.deque()
        self._queued_rows = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # one worker: a forward already uses torch's intra-op threads, and the event loop needs a core
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="recstream-predict")

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._dispatch(), name="recstream-batcher")

    async def predict(self, instances: list, deadline: float | None = None) -> tuple[list[float], int]:
        """``(scores, version)`` for `instances` (already shape-checked); RequestError if refused.

        `deadline` (``time.monotonic()`` seconds): past it the request is answered 503 and its
        rows are dropped from the queue if they have not started yet.
        """
        if self._task is None or self._task.done():
            self._start()
        if self._queued_rows + len(instances) > self.max_queued_rows and self._queue:
            raise RequestError(503, f"overloaded: more than {self.max_queued_rows} instances are waiting; retry later",
                               retry_after=1)
        job = _Job(instances, self._loop.create_future())
        self._queue.append(job)
        self._queued_rows += job.rows
        self._wake.set()
        timer = None
        if deadline is not None:
            timer = self._loop.call_later(max(deadline - time.monotonic(), 0), _expire, job.future)
        try:
            result = await job.future
        finally:
            if timer is not None:
                timer.cancel()
        if isinstance(result, RequestError):
            raise result
        return result

    def _take(self) -> list[_Job]:
        jobs, rows = [], 0
        while self._queue and (not jobs or rows + self._queue[0].rows <= self.max_batch_rows):
            job = self._queue.popleft()
            self._queued_rows -= job.rows
            if job.future.done():  # its client gave up (deadline): skip the work
                continue
            jobs.append(job)
            rows += job.rows
        return jobs

    async def _gather(self) -> None:
        """Wait (at most `max_wait`) while requests are still arriving and the batch has room."""
        end = time.monotonic() + self.max_wait
        while self.arriving > 0 and self._queued_rows < self.max_batch_rows:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except asyncio.TimeoutError:
                return

    async def _dispatch(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if self.max_wait > 0:
                await self._gather()
            jobs = self._take()
            if not jobs:
                continue
            served = self.holder.current  # read ONCE: the whole batch runs on this version
            try:
                results = await self._loop.run_in_executor(self._executor, run_batch, served, jobs)
            except Exception as e:  # a model error: every request of the batch fails, the server goes on
                log.exception("prediction failed for a batch of %d requests", len(jobs))
                results = [RequestError(500, f"internal error: {type(e).__name__}")] * len(jobs)
            if self.on_batch is not None:
                self.on_batch(sum(j.rows for j in jobs))
            for job, result in zip(jobs, results, strict=True):
                if not job.future.done():
                    job.future.set_result(result)

    def close(self) -> None:
        """Stop the dispatcher (call on the loop, or after it ended) and the worker thread."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
