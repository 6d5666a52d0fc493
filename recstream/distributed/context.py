"""The process group and the parallel context: which parallel mode a run uses, on how many ranks.

`init()` reads the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``) and joins the process group: gloo on CPU, NCCL when the process
has a GPU. In a plain ``python`` process (no ``WORLD_SIZE``, or 1) it does nothing, so the same
script runs unchanged under ``python`` and ``torchrun --nproc_per_node=N``.

`set_auto_parallel_context(parallel_mode=...)` picks how `Model` trains, as MindSpore's context:

- ``"stand_alone"``: one process, nothing shared (the default in a plain process);
- ``"data_parallel"``: every parameter replicated, gradients averaged across ranks after each
  backward (`torch.nn.parallel.DistributedDataParallel` for dense parameters; the sparse row
  gradients of embedding tables are all-reduced as sparse tensors, never densified);
- ``"hybrid_parallel"``: dense parameters replicated as in data_parallel, the rows of every
  `EmbeddingBagCollection` table sharded across the ranks (each row, and its optimizer state,
  on one rank; lookups routed there with all-to-all).

>>> init()  # a plain process: nothing to join
>>> get_auto_parallel_context("parallel_mode"), world_size(), rank()
('stand_alone', 1, 0)
>>> set_auto_parallel_context(parallel_mode="data_parallel")
>>> get_auto_parallel_context("parallel_mode"), parallel_mode()  # set; what runs on one process
('data_parallel', 'stand_alone')
>>> reset_auto_parallel_context()
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from ..validation import check_choice, check_str

log = logging.getLogger("recstream.distributed")

PARALLEL_MODES = ("stand_alone", "data_parallel", "hybrid_parallel")
_context = {"parallel_mode": None}  # None: decided by the process group (see `parallel_mode`)


def is_distributed() -> bool:
    """Whether this process is one rank of an initialised process group of more than one."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def init(backend: str | None = None) -> None:
    """Join the process group ``torchrun`` describes in the environment; a no-op without one.

    `backend` defaults to ``"cpu:gloo,cuda:nccl"`` (NCCL for CUDA tensors, gloo for CPU ones) when
    every rank of this machine has a GPU of its own, else gloo (also several ranks sharing one GPU:
    NCCL refuses two ranks on one device). With NCCL each process uses the GPU ``LOCAL_RANK``.
    Calling it again in an initialised process does nothing.
    """
    check_str("init", "backend", backend, allow_none=True)
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        backend = "cpu:gloo,cuda:nccl" if gpus >= local_ranks else "gloo"
    if "nccl" in backend:
        if local_rank >= gpus:
            raise ValueError(f"init: backend {backend!r} needs one GPU per local rank, but LOCAL_RANK={local_rank} "
                             f"and this machine has {gpus} GPU(s); use backend='gloo' or fewer ranks per machine")
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend)
    log.info("rank %d of %d joined the process group (%s)", dist.get_rank(), dist.get_world_size(), backend)


def shutdown() -> None:
    """Leave the process group once every rank got here (a no-op in a plain process).

    Call it at the end of a script run by ``torchrun``: a rank that exits while another still
    talks to it can abort that one's communication threads.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def set_auto_parallel_context(parallel_mode: str | None = None) -> None:
    """Choose the parallel mode of the `Model`\\ s built afterwards (see the module docstring)."""
    if parallel_mode is not None:
        _context["parallel_mode"] = check_choice("set_auto_parallel_context", "parallel_mode", parallel_mode,
                                                 PARALLEL_MODES)


def get_auto_parallel_context(key: str):
    """The value of one context setting (``"parallel_mode"``, ``"device_num"``, ``"global_rank"``).

    ``"parallel_mode"`` is the mode set (or the default for this process group); `parallel_mode()`
    is the one that runs (``"stand_alone"`` on a single process whatever was set).
    """
    check_choice("get_auto_parallel_context", "key", key, ("parallel_mode", "device_num", "global_rank"))
    if key == "device_num":
        return world_size()
    if key == "global_rank":
        return rank()
    mode = _context["parallel_mode"]
    return mode if mode is not None else parallel_mode()


def reset_auto_parallel_context() -> None:
    """Back to the default: the mode follows the process group."""
    _context["parallel_mode"] = None


def parallel_mode() -> str:
    """The mode in effect: the one set, else "data_parallel" on several ranks and "stand_alone" on one."""
    mode = _context["parallel_mode"]
    if mode is None:
        return "data_parallel" if is_distributed() else "stand_alone"
    if mode != "stand_alone" and not is_distributed():
        return "stand_alone"  # one rank: there is nothing to share (the script runs unchanged)
    if mode == "stand_alone" and is_distributed():
        raise ValueError(f"parallel_mode 'stand_alone' was set but this process is rank {rank()} of "
                         f"{world_size()}; use 'data_parallel' or 'hybrid_parallel', or run a single process")
    return mode
