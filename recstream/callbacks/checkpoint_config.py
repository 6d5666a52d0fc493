"""CheckpointConfig: when `ModelCheckpoint` saves and how many files it keeps (MindSpore's rules).

- Saving is by steps (``save_checkpoint_steps``) or by seconds (``save_checkpoint_seconds``);
  when steps is set (> 0) it wins and seconds is ignored.
- Keeping is by count (``keep_checkpoint_max``) or by time (``keep_checkpoint_per_n_minutes``:
  one file per N minutes); when the count is set (> 0) it wins. When neither is set, one file is kept.
- The four cannot all be 0/None.
- ``append_info``: a list of ``"epoch_num"`` / ``"step_num"`` and at most one dict of extra
  str -> int/float/bool/str/tensor entries, stored in every file's metadata.
- ``exception_save``: save a ``..._breakpoint`` file when training raises.

>>> cfg = CheckpointConfig(save_checkpoint_steps=100, keep_checkpoint_max=3, append_info=["epoch_num", {"lr": 0.01}])
>>> cfg.save_checkpoint_steps, cfg.save_checkpoint_seconds, cfg.append_dict
(100, None, {'epoch_num': 0, 'lr': 0.01})
"""
from __future__ import annotations

import torch

from ..validation import check_bool, check_choice, check_int, check_module, check_type, describe

_OWNER = "CheckpointConfig"
_INFO_NAMES = ("epoch_num", "step_num")
_INFO_VALUE_TYPES = (int, float, bool, str, torch.Tensor)


def _append_dict(append_info) -> dict | None:
    """``append_info`` as the dict stored in every file (None when empty)."""
    if append_info is None or append_info == []:
        return None
    check_type(_OWNER, "append_info", append_info, list)
    out: dict = {}
    dicts = [e for e in append_info if isinstance(e, dict)]
    if len(dicts) > 1:
        raise ValueError(f"{_OWNER}: 'append_info' may hold at most one dict, got {len(dicts)}: {append_info!r}")
    for i, element in enumerate(append_info):
        if isinstance(element, str):
            out[check_choice(_OWNER, f"append_info[{i}]", element, _INFO_NAMES)] = 0  # filled in at each save
        elif isinstance(element, dict):
            for key, value in element.items():
                if not isinstance(key, str) or not isinstance(value, _INFO_VALUE_TYPES):
                    raise TypeError(f"{_OWNER}: 'append_info' dict entries must be str -> int/float/bool/str/Tensor, "
                                    f"got {key!r}: {describe(value)}")
                out[key] = value
        else:
            raise TypeError(f"{_OWNER}: 'append_info[{i}]' must be a str or a dict, got {describe(element)}")
    return out


class CheckpointConfig:
    """Configuration of `ModelCheckpoint` (see the module docstring for the rules).

    `saved_network`: save this module instead of the training run's network. `crc_check`: store a
    CRC32 per tensor, verified by `load_checkpoint` (default on, unlike MindSpore, because a
    silently corrupt checkpoint is worse than the few hundred ms per GB the check costs).
    All four counts are ints >= 0 or None.
    """

    def __init__(self, save_checkpoint_steps=1, save_checkpoint_seconds=0, keep_checkpoint_max=5,
                 keep_checkpoint_per_n_minutes=0, append_info=None, exception_save=False,
                 saved_network=None, crc_check=True):
        def count(name, value):
            return check_int(_OWNER, name, value, minimum=0, allow_none=True)

        save_checkpoint_steps = count("save_checkpoint_steps", save_checkpoint_steps)
        save_checkpoint_seconds = count("save_checkpoint_seconds", save_checkpoint_seconds)
        keep_checkpoint_max = count("keep_checkpoint_max", keep_checkpoint_max)
        keep_checkpoint_per_n_minutes = count("keep_checkpoint_per_n_minutes", keep_checkpoint_per_n_minutes)
        counts = (save_checkpoint_steps, save_checkpoint_seconds, keep_checkpoint_max, keep_checkpoint_per_n_minutes)
        if not any(counts):
            raise ValueError(f"{_OWNER}: 'save_checkpoint_steps', 'save_checkpoint_seconds', 'keep_checkpoint_max' "
                             "and 'keep_checkpoint_per_n_minutes' can't all be None or 0, got "
                             f"{save_checkpoint_steps!r}, {save_checkpoint_seconds!r}, {keep_checkpoint_max!r}, "
                             f"{keep_checkpoint_per_n_minutes!r}")
        check_bool(_OWNER, "exception_save", exception_save)
        check_bool(_OWNER, "crc_check", crc_check)
        check_module(_OWNER, "saved_network", saved_network, allow_none=True)

        self._save_checkpoint_steps = save_checkpoint_steps
        self._save_checkpoint_seconds = save_checkpoint_seconds
        if save_checkpoint_steps:  # steps wins over seconds
            self._save_checkpoint_seconds = None
        self._keep_checkpoint_max = keep_checkpoint_max
        self._keep_checkpoint_per_n_minutes = keep_checkpoint_per_n_minutes
        if keep_checkpoint_max:  # count wins over time
            self._keep_checkpoint_per_n_minutes = None
        elif not keep_checkpoint_per_n_minutes:
            self._keep_checkpoint_max = 1
        self._append_dict = _append_dict(append_info)
        self.exception_save = exception_save
        self.saved_network = saved_network
        self.crc_check = crc_check

    @property
    def save_checkpoint_steps(self):
        return self._save_checkpoint_steps

    @property
    def save_checkpoint_seconds(self):
        return self._save_checkpoint_seconds

    @property
    def keep_checkpoint_max(self):
        return self._keep_checkpoint_max

    @property
    def keep_checkpoint_per_n_minutes(self):
        return self._keep_checkpoint_per_n_minutes

    @property
    def append_dict(self) -> dict | None:
        return self._append_dict

    def get_checkpoint_policy(self) -> dict:
        """The policy as a dict (MindSpore's method of the same name)."""
        return {"save_checkpoint_steps": self.save_checkpoint_steps,
                "save_checkpoint_seconds": self.save_checkpoint_seconds,
                "keep_checkpoint_max": self.keep_checkpoint_max,
                "keep_checkpoint_per_n_minutes": self.keep_checkpoint_per_n_minutes,
                "saved_network": self.saved_network}

    def __repr__(self) -> str:
        policy = ", ".join(f"{k}={v!r}" for k, v in self.get_checkpoint_policy().items() if k != "saved_network")
        return f"CheckpointConfig({policy}, append_info={self._append_dict!r}, exception_save={self.exception_save})"
