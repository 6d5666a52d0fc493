"""Key sharding of a [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] over the ranks of a process group.

`KeySharding` gives every int64 key one owning rank, ``owner(key) = mix(hash(key)) % world_size``
(`owner_of`): a second mix of the table's own hash, so the keys one rank owns still spread over
all slots of its local table (the slot index uses the low bits of the first hash). Each rank's
table holds only the keys it owns: their rows, counts, last-seen steps and pending state.

A lookup (`lookup`) then runs in four moves, the same as `row_sharding` for fused tables:

1. every rank sends each of its batch's unique keys, with its number of occurrences, to the
   key's owner (all-to-all; the per-rank counts go first, so each step costs one small host sync
   to size the transfer);
2. the owner merges what all ranks asked (summing occurrences, so admission counts the whole
   global batch), counts, admits and evicts in its own table, and gathers the rows;
3. the rows travel back (a differentiable all-to-all: in backward each row's gradient returns
   to its owner the same way and lands as a sparse gradient of the owner's ``values``, so the
   row-wise optimizer state lives with its shard);
4. the asking rank puts them back in its keys' order.

Traffic per step and rank: ``unique keys x 16`` bytes out and ``unique keys x dim x 4`` bytes of
rows back (and the same again for gradients), independent of the table's size.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .row_sharding import _AllToAll, _DivideGrad
from .tensor_hash_table import hash_keys

__all__ = ["KeySharding", "owner_of"]

_SALT = 0x2545F491  # any odd 32-bit constant: decorrelates the owner from the slot bits


def owner_of(keys: torch.Tensor, world_size: int) -> torch.Tensor:
    """The rank owning each of `keys` among `world_size` ranks (int64, same shape).

    >>> owner_of(torch.tensor([0, 1, 2, 3, 2**40]), 1).tolist()
    [0, 0, 0, 0, 0]
    """
    return hash_keys(hash_keys(keys) ^ _SALT) % world_size


class KeySharding:
    """This rank's place among the ranks of `group`, and the routed lookup of a key-sharded table."""

    def __init__(self, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def owned(self, keys: torch.Tensor) -> torch.Tensor:
        """Bool mask of the `keys` this rank owns."""
        return owner_of(keys, self.world_size) == self.rank

    def scale_gradient(self, values: torch.Tensor) -> None:
        """Average the shard's gradient over the ranks (each rank's loss is a mean over its part)."""
        values.register_post_accumulate_grad_hook(_DivideGrad(self.world_size))

    def lookup(self, uniq: torch.Tensor, counts: torch.Tensor,
               local: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``[len(uniq), dim]``: the vectors of this rank's unique keys, from their owners.

        `local(keys, counts, inverse)` runs on the owner: the unique keys every rank asked for,
        their summed occurrences, and `inverse` mapping each asked entry to its key; it returns
        one vector per asked entry. Every rank must call this the same number of times per step
        (it runs collectives), with an empty `uniq` when it has no keys.
        """
        owner = owner_of(uniq, self.world_size)
        order = torch.argsort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=self.world_size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()  # the one host sync: sizes the transfers
        # Keys and their occurrence counts travel together, as the two columns of one tensor.
        pairs = torch.stack([uniq.index_select(0, order), counts.index_select(0, order)], dim=1)
        asked = pairs.new_empty(sum(recv), 2)
        dist.all_to_all_single(asked, pairs, recv, send, group=self.group)
        keys, inverse = torch.unique(asked[:, 0], return_inverse=True)
        merged = torch.zeros_like(keys).index_add_(0, inverse, asked[:, 1])  # occurrences over all ranks
        rows = local(keys, merged, inverse)
        answered = _AllToAll.apply(rows, send, recv, self.group)
        return torch.zeros_like(answered).index_copy(0, order, answered)  # back to the keys' order
