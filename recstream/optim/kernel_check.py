"""The check that the Triton row kernels work on a device before its tables use them.

`recstream.optim.triton_rows.kernels_work` asks it once per CUDA device: small tables are stepped
with the kernels and with the torch ops (LazyAdam plain and capturable with a ``found_inf`` flag,
RowWiseAdagrad, FTRL, duplicate ids) and must agree. A kernel this machine's Triton cannot compile,
or one that disagrees, is warned about and the device's row updates run on the torch ops: the cost
is speed, not the run. (A module of its own: it steps the optimizers, which import `triton_rows`.)
"""
from __future__ import annotations

import functools
import logging

import torch

from . import triton_rows
from .ftrl import FTRL
from .lazy_adam import LazyAdam
from .rowwise_adagrad import RowWiseAdagrad

log = logging.getLogger(__name__)


@functools.cache
def _kernels_match_torch(device: str) -> bool:
    cases = [(LazyAdam, {}), (LazyAdam, {"capturable": True}), (RowWiseAdagrad, {}), (FTRL, {})]
    rows = torch.tensor([1, 3, 1, 6], device=device)
    enabled, triton_rows._checking.on = triton_rows.ENABLED, True
    try:
        for cls, flags in cases:
            weights = []
            for on in (True, False):
                triton_rows.ENABLED = on
                w = torch.nn.Parameter(torch.linspace(-1, 1, 32, device=device).view(8, 4))
                opt = cls([w], lr=0.1)
                if flags:
                    opt.param_groups[0].update(flags, lr=torch.tensor(0.1, device=device))
                    opt.found_inf = torch.zeros((), device=device)
                for step in range(2):
                    w.grad = torch.sparse_coo_tensor(rows.view(1, -1), torch.full((4, 4), step + 0.5, device=device),
                                                     w.shape, check_invariants=False)
                    opt.step()
                weights.append(w.detach().cpu())
            if not torch.allclose(weights[0], weights[1], rtol=1e-5, atol=1e-6):
                log.warning("recstream.optim: the Triton row kernels disagree with the torch ops on %s (%s); "
                            "row updates there run on the torch ops", device, cls.__name__)
                return False
    except Exception as e:  # noqa: BLE001 -- any failure of the optional kernels means: use the torch ops
        log.warning("recstream.optim: the Triton row kernels failed on %s (%s: %s); row updates there run on "
                    "the torch ops", device, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return False
    finally:
        triton_rows.ENABLED, triton_rows._checking.on = enabled, False
    return True


triton_rows._device_check = _kernels_match_torch
