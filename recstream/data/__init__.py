"""recstream.data: feature schemas, columnar batches, streaming readers and pipeline stages.

* `Schema`, `DenseFeature`, `CategoricalFeature`, `CrossFeature`: what the columns
  mean and how big each embedding table is (JSON-able, saved next to checkpoints).
* [`Batch`][recstream.data.batch.Batch] ``(features, labels)`` and `Features`: dense float32 + flat int64
  ids with feature-major offsets, ready for ``torch.nn.EmbeddingBag``.
* Readers, each a re-iterable stream of Batches in constant memory: `ParquetReader`,
  `CSVReader`, `CriteoReader`; bad rows raise `BadRowError` (file
  and row named) or, with ``on_bad_row="skip"``, are counted in ``reader.bad_rows``.
* Data sets: `SyntheticCTR` (Zipf ids, known Bayes AUC), `DriftingCTR` (an online
  stream with new users/items, shifting popularity and drifting tastes, known Bayes AUC over
  time), `ColdStartCTR` (a rating stream full of new users, with attribute and user x
  genre interactions, known Bayes AUC), `load_adult`.
* Pipeline: `Rebatcher` (exact batch sizes), `ShuffleBuffer` (row-level shuffle),
  `Prefetcher` (background thread, pinned memory, async device copies), `InMemoryDataset`.

>>> from recstream.data import SyntheticCTR, ShuffleBuffer
>>> gen = SyntheticCTR(num_dense=3, num_categorical=4, batch_size=128)
>>> for features, labels in ShuffleBuffer(gen.train_batches(2), buffer_size=256):
...     features.validate(gen.schema).dense.shape
torch.Size([128, 3])
torch.Size([128, 3])
"""
from ..features import Features
from .adult import adult_schema, load_adult
from .badrows import REASONS as BAD_ROW_REASONS
from .badrows import BadRowError
from .batch import Batch
from .coldstart import ColdStartCTR
from .drifting import DriftingCTR
from .hashing import hash_int64, hash_strings, to_buckets
from .memory import InMemoryDataset, from_arrow, from_pandas
from .pipeline import Prefetcher, Rebatcher, ShuffleBuffer
from .readers import CriteoReader, CSVReader, ParquetReader, criteo_schema
from .schema import CategoricalFeature, CrossFeature, DenseFeature, Schema, num_embeddings
from .synthetic import SyntheticCTR, roc_auc

__all__ = [
    "Schema", "DenseFeature", "CategoricalFeature", "CrossFeature", "num_embeddings",
    "Batch", "Features",
    "ParquetReader", "CSVReader", "CriteoReader", "criteo_schema", "BadRowError", "BAD_ROW_REASONS",
    "InMemoryDataset", "from_arrow", "from_pandas", "SyntheticCTR", "DriftingCTR", "ColdStartCTR", "roc_auc",
    "load_adult", "adult_schema",
    "ShuffleBuffer", "Prefetcher", "Rebatcher",
    "hash_int64", "hash_strings", "to_buckets",
]
