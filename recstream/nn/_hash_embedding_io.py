"""Export / import of :class:`~recstream.nn.HashEmbedding` rows, for serving.

* ``export()`` -- every admitted key with its row, occurrence count and
  last-seen step (pending keys are not exported: they have no row).
* ``export_delta()`` -- only rows marked dirty since the previous export (new
  keys, rows looked up in training -- they get gradients -- and rows changed by
  ``max_norm`` or ``load_rows``), plus ``evicted_keys``: keys whose row was
  evicted since the previous export and that are not live again. A consumer
  applies ``evicted_keys`` as deletes and the rest as upserts.
* ``load_rows(keys, values, counts, last_seen)`` / ``import_(exported)`` --
  insert or overwrite rows (admitting the keys).

The eviction log only starts after the first export (before it nothing was
published, so nothing needs deleting), which keeps it bounded by the evictions
between two exports.

This mixin only holds methods; the state is created by ``HashEmbedding``.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch

from ._checks import check_int_tensor

__all__ = ["_RowIO"]


class _RowIO:
    """Export / import methods of ``HashEmbedding``."""

    def _rows_dict(self, rows: torch.Tensor) -> Dict[str, torch.Tensor]:
        slots = self.row_slots[rows]
        t = self.table
        return {"keys": t.keys[slots].clone(), "values": self.values.detach()[rows].clone(),
                "counts": t.counts[slots].clone(), "last_seen": t.last_seen[slots].clone()}

    def _start_delta(self) -> None:
        self.dirty.zero_()
        self.evicted_keys = self.evicted_keys[:0]
        self._track_evictions = True
        self.track_evictions_t.fill_(1)

    @torch.no_grad()
    def export(self, reset_delta: bool = True) -> Dict[str, torch.Tensor]:
        """All admitted rows: ``{"keys", "values", "counts", "last_seen"}``, ordered by row.

        With ``reset_delta`` the export is the new baseline of ``export_delta``.
        """
        out = self._rows_dict((self.row_slots >= 0).nonzero().squeeze(1))
        if reset_delta:
            self._start_delta()
        return out

    @torch.no_grad()
    def export_delta(self) -> Dict[str, torch.Tensor]:
        """Rows changed since the last export, plus ``"evicted_keys"`` (deletes)."""
        out = self._rows_dict(((self.row_slots >= 0) & self.dirty).nonzero().squeeze(1))
        gone = torch.unique(self.evicted_keys)
        if gone.numel():
            slots = self.table.find(gone)
            live = (slots >= 0) & (self.table.rows[slots.clamp(min=0)] >= 0)
            gone = gone[~live]  # re-admitted since: published as an upsert instead
        out["evicted_keys"] = gone
        self._start_delta()
        return out

    def import_(self, exported: Mapping[str, torch.Tensor]) -> None:
        """Load the output of :meth:`export` (or of ``export_delta`` minus its deletes)."""
        if not isinstance(exported, Mapping) or "keys" not in exported or "values" not in exported:
            raise TypeError("exported must be a mapping with at least 'keys' and 'values' "
                            f"(as returned by export()), got {type(exported).__name__}")
        self.load_rows(exported["keys"], exported["values"], exported.get("counts"),
                       exported.get("last_seen"))

    @torch.no_grad()
    def load_rows(self, keys: torch.Tensor, values: torch.Tensor,
                  counts: Optional[torch.Tensor] = None,
                  last_seen: Optional[torch.Tensor] = None) -> None:
        """Insert or overwrite rows for unique ``keys`` ``[n]`` with ``values`` ``[n, dim]``.

        ``counts`` defaults to ``max(current count, permit_filter_value)`` and
        ``last_seen`` to the current step. New keys take free rows (reported by
        ``pop_reset_rows``); raises ValueError if there are not enough, rather
        than evicting.
        """
        keys = self._check_keys(check_int_tensor("keys", keys, ndim=1))
        n, dev = keys.numel(), self.values.device
        keys = keys.to(dev)
        if not isinstance(values, torch.Tensor) or values.shape != (n, self.embedding_size):
            got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
            raise ValueError(f"values must be a tensor of shape ({n}, {self.embedding_size}), got {got}")
        for name, v in (("counts", counts), ("last_seen", last_seen)):
            if v is not None and check_int_tensor(name, v, ndim=1).numel() != n:
                raise ValueError(f"{name} must have {n} entries (one per key), got {v.numel()}")
        if torch.unique(keys).numel() != n:
            raise ValueError("keys must be unique, got duplicates")
        t = self.table
        slots = t.find(keys)
        new = (slots < 0).nonzero().squeeze(1)
        need_row = slots < 0
        need_row[slots >= 0] = t.rows[slots[slots >= 0]] < 0
        n_rows = int(need_row.sum())
        if n_rows > self._num_free:
            raise ValueError(f"keys need {n_rows} new rows but only {self._num_free} of capacity="
                             f"{self.capacity} are free; raise capacity or load fewer keys")
        if self._rehash_if_needed(new.numel()):
            slots = t.find(keys)
        n_pending = n_rows - new.numel()  # pending keys being admitted
        slots[new] = t.insert(keys[new])
        self._set_pending(self._num_pending - n_pending)
        self._assign_rows(slots[need_row])
        rows = t.rows[slots]
        self.values[rows] = values.to(device=dev, dtype=self.values.dtype)
        if counts is None:
            t.counts[slots] = t.counts[slots].clamp(min=self.permit_filter_value)
        else:
            t.counts[slots] = counts.to(device=dev, dtype=torch.int64)
        t.last_seen[slots] = self._step if last_seen is None else last_seen.to(dev, torch.int64)
        self.dirty[rows] = True
