"""The Triton kernels of `recstream.optim.triton_rows` (see there); empty where Triton is not installed.

Each kernel is one launch over the ``n`` entries of a row-sparse gradient whose entries of a row were
summed at that row's leader entry (``triton_rows._leaders``: one ``index_add_``, parallel however
hot a row), or of a dense gradient (``DENSE``: entry ``i`` is row ``i``, nothing to sum). A program
takes ``BLOCK_N`` entries as a [BLOCK_N, BLOCK_D] block (one program per entry made hundreds of
thousands of one-warp programs at batch 16,384, half their lanes idle at width 16): only a row's
leader works -- it reads, updates and writes that row of the table and of its state; the other
entries write nothing. So every row is written once, and no
size is data (no host read, capturable in a CUDA graph).

``found`` (a loss-scaled step's ``found_inf``, when ``HAS_FOUND``) masks every write off where it is
non-zero: an overflowing step changes nothing, read on the device. ``CAPTURABLE``: the step count
(and the learning rate, when ``LR_ON_DEVICE``) are read from device tensors and the bias corrections
computed here, in float64 (``1 - beta2 ** t`` is ~1e-3 early on: float32's ``exp`` would cost it
four digits).

Only long-stable ``tl`` operations are used (load/store/arange/where/sum/sqrt/exp/log, constexpr
blocks): the GPU machine's Triton may be older than the one here.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the library works without Triton (torch ops run instead)
    triton = tl = None

__all__ = ["lazy_adam", "rowwise_adagrad", "ftrl"]

if triton is not None:

    @triton.jit
    def _run_sum(rows, lead, values, found, block, n, dim, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 HAS_FOUND: tl.constexpr, DENSE: tl.constexpr):
        """(rows [BLOCK_N], their summed gradients [BLOCK_N, BLOCK_D], column offsets [BLOCK_D], column
        mask, columns to write per entry [BLOCK_N]: `dim` or 0) for the `block`-th BLOCK_N entries,
        whose rows' gradients were summed at each row's leader entry (`triton_rows._leaders`);
        `DENSE`: a dense gradient, entry `i` is row `i`. Only a leader is read past its row: the other
        entries' gradients are zeros, not worth their bandwidth."""
        i = block * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < dim
        if DENSE:
            row = i.to(tl.int64)
            bound = tl.where(i < n, dim, 0)
        else:
            row = tl.load(rows + i, mask=i < n, other=0)
            leader = tl.load(lead + i, mask=i < n, other=-1)
            # Which columns to write, as a bound (Triton's interpreter makes `bool_block & bool_scalar`
            # an int block, which a mask refuses): all of them for a row's leader, none elsewhere.
            bound = tl.where(leader == i, dim, 0)
        lead_bound = bound
        if HAS_FOUND:
            bound = tl.where(tl.load(found) == 0, bound, 0)
        at = values + i.to(tl.int64)[:, None] * dim + cols[None, :]
        grad = tl.load(at, mask=cols[None, :] < bound[:, None], other=0.0)
        if not DENSE:  # the sums are a kept buffer of zeros (`triton_rows._zeros`): zeros again, found or not;
            # each leader's program alone reads and writes its sum, so no other program sees the store
            tl.store(at, tl.zeros([BLOCK_N, BLOCK_D], tl.float32), mask=cols[None, :] < lead_bound[:, None])
        return row, grad, cols, col_ok, bound

    @triton.jit
    def _lr(lr, lr_ptr, LR_ON_DEVICE: tl.constexpr):
        if LR_ON_DEVICE:
            rate = tl.load(lr_ptr)
        else:
            rate = lr
        return rate

    @triton.jit
    def lazy_adam(weight, exp_avg, exp_avg_sq, rows, lead, values, found, step_ptr, lr_ptr, n, dim,
                  step_size, bias2_sqrt, lr, one_minus_beta1, beta2, one_minus_beta2, eps, ln_beta1, ln_beta2,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_FOUND: tl.constexpr, DENSE: tl.constexpr,
                  CAPTURABLE: tl.constexpr, LR_ON_DEVICE: tl.constexpr):
        row, grad, cols, col_ok, bound = _run_sum(rows, lead, values, found, tl.program_id(0), n, dim,
                                                  BLOCK_N, BLOCK_D, HAS_FOUND, DENSE)
        if CAPTURABLE:
            t = tl.load(step_ptr).to(tl.float64)
            size = _lr(lr, lr_ptr, LR_ON_DEVICE) / (1.0 - tl.exp(t * ln_beta1)).to(tl.float32)
            bias2 = tl.sqrt(1.0 - tl.exp(t * ln_beta2)).to(tl.float32)
        else:
            size = step_size
            bias2 = bias2_sqrt
        at = row[:, None] * dim + cols[None, :]
        mask = cols[None, :] < bound[:, None]
        m = tl.load(exp_avg + at, mask=mask, other=0.0)
        v = tl.load(exp_avg_sq + at, mask=mask, other=0.0)
        w = tl.load(weight + at, mask=mask, other=0.0)
        m = m + one_minus_beta1 * (grad - m)  # torch's lerp for a weight < 0.5
        v = v * beta2 + one_minus_beta2 * grad * grad
        w = w - size * (m / (tl.sqrt(v) / bias2 + eps))
        tl.store(exp_avg + at, m, mask=mask)
        tl.store(exp_avg_sq + at, v, mask=mask)
        tl.store(weight + at, w, mask=mask)

    @triton.jit
    def rowwise_adagrad(weight, acc, rows, lead, values, found, lr_ptr, n, dim, lr, eps, weight_decay,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_FOUND: tl.constexpr, DENSE: tl.constexpr,
                        LR_ON_DEVICE: tl.constexpr):
        row, grad, cols, col_ok, bound = _run_sum(rows, lead, values, found, tl.program_id(0), n, dim,
                                                  BLOCK_N, BLOCK_D, HAS_FOUND, DENSE)
        rate = _lr(lr, lr_ptr, LR_ON_DEVICE)
        at = row[:, None] * dim + cols[None, :]
        mask = cols[None, :] < bound[:, None]
        w = tl.load(weight + at, mask=mask, other=0.0)
        grad = grad + weight_decay * w
        squares = tl.sum(tl.where(col_ok[None, :], grad * grad, 0.0), axis=1) / dim
        total = tl.load(acc + row, mask=bound > 0, other=0.0) + squares
        w = w - rate * (grad / (tl.sqrt(total)[:, None] + eps))
        tl.store(acc + row, total, mask=bound > 0)
        tl.store(weight + at, w, mask=mask)

    @triton.jit
    def _power(x, power, zero_power, HALF: tl.constexpr):
        """``x ** power`` for ``x >= 0`` (``0 ** 0`` = 1, as torch's pow)."""
        if HALF:
            out = tl.sqrt(x)
        else:
            out = tl.where(x > 0, tl.exp(power * tl.log(tl.where(x > 0, x, 1.0))), zero_power)
        return out

    @triton.jit
    def ftrl(weight, accumulator, linear, rows, lead, values, found, lr_ptr, n, dim, lr, power, zero_power,
             l1, l2, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_FOUND: tl.constexpr, DENSE: tl.constexpr,
             LR_ON_DEVICE: tl.constexpr, HALF: tl.constexpr):
        row, grad, cols, col_ok, bound = _run_sum(rows, lead, values, found, tl.program_id(0), n, dim,
                                                  BLOCK_N, BLOCK_D, HAS_FOUND, DENSE)
        rate = _lr(lr, lr_ptr, LR_ON_DEVICE)
        at = row[:, None] * dim + cols[None, :]
        mask = cols[None, :] < bound[:, None]
        acc = tl.load(accumulator + at, mask=mask, other=1.0)  # 1: no 0 / 0 in the unwritten lanes
        z = tl.load(linear + at, mask=mask, other=0.0)
        w = tl.load(weight + at, mask=mask, other=0.0)
        acc_new = acc + grad * grad
        acc_new_pow = _power(acc_new, power, zero_power, HALF)
        sigma = (acc_new_pow - _power(acc, power, zero_power, HALF)) / rate
        z = z + grad - sigma * w
        quadratic = acc_new_pow / rate + l2
        sign = tl.where(z > 0, 1.0, tl.where(z < 0, -1.0, 0.0))
        w = tl.where(tl.abs(z) > l1, (sign * l1 - z) / quadratic, 0.0)
        tl.store(linear + at, z, mask=mask)
        tl.store(accumulator + at, acc_new, mask=mask)
        tl.store(weight + at, w, mask=mask)
