"""recstream.checkpoint: the checkpoint file and durable file writes, below callbacks and serving.

- `save_checkpoint` / `load_checkpoint` / `CheckpointError` (`CheckpointMismatch`: a sound file of
  another model): one safetensors file holding a
  network, its optimizer, RNG states and extra metadata, enough to resume training exactly
  (format: `recstream.checkpoint.file_format`; nested state is encoded by
  `recstream.checkpoint.state_codec`, never pickled).
- `KEY_ENV` (``RECSTREAM_CHECKPOINT_KEY``): set it to sign every checkpoint written and refuse
  every one read that is unsigned or fails its keyed digest (`recstream.checkpoint.keyed_digest`;
  CRC32 catches accidents, the keyed digest catches edits).
- `save_sharded` / `load_sharded` / `is_complete`: sharded checkpoints (hybrid_parallel) on
  `torch.distributed.checkpoint`, each rank writing its rows; they load into any number of ranks
  (`recstream.checkpoint.sharded`).
- `atomic_write`, `fsync_file`, `fsync_dir`: write a file so a crash leaves the old one or the
  complete new one (`recstream.atomic`, re-exported here); serving's snapshots use them too.

When to save (every N steps, keep M files) is `recstream.callbacks.ModelCheckpoint`'s business.

>>> import os, tempfile, torch
>>> path = save_checkpoint(os.path.join(tempfile.mkdtemp(), "net.safetensors"), torch.nn.Linear(2, 1))
>>> sorted(load_checkpoint(path, torch.nn.Linear(2, 1), restore_rng=False))
['format_version', 'time']
"""
from ..atomic import atomic_write, fsync_dir, fsync_file
from .file_format import CheckpointError, CheckpointMismatch, load_checkpoint, save_checkpoint
from .keyed_digest import KEY_ENV
from .sharded import is_complete, load_sharded, save_sharded

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError", "CheckpointMismatch", "KEY_ENV", "atomic_write",
           "fsync_dir", "fsync_file", "save_sharded", "load_sharded", "is_complete"]
