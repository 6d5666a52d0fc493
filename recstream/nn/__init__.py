"""Embedding layers of recstream.

* `EmbeddingBagCollection` + `EmbeddingTableConfig` -- fixed-size
  tables with pooled (sum/mean, multi-hot) lookups, all tables fused into one
  storage per embedding dim and one ``embedding_bag`` call per dim per step.
* [`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] -- dynamic table for unbounded int64 id spaces
  (admission, age/LRU eviction, sparse gradients, export for serving), built
  on `TensorHashTable`, an open-addressing hash table on tensors.
* `DiskTier` -- an ``EmbeddingTableConfig(tier=...)`` keeps the table's rows and
  optimizer state on local disk behind a cache of hot rows (tables larger than RAM).

Example:
    >>> import torch
    >>> from recstream.nn import EmbeddingBagCollection, EmbeddingTableConfig, HashEmbedding
    >>> ebc = EmbeddingBagCollection([EmbeddingTableConfig("cat", 100, 8)])
    >>> ebc(torch.tensor([3, 4, 5]), torch.tensor([0, 2, 3]), batch_size=2).shape
    torch.Size([2, 8])
    >>> HashEmbedding(8, capacity=1024)(torch.tensor([7, 2**50])).shape
    torch.Size([2, 8])
"""

from .embedding_bag_collection import EmbeddingBagCollection
from .embedding_config import DiskTier, EmbeddingTableConfig, TierPlan
from .hash_embedding import HashEmbedding
from .tensor_hash_table import TensorHashTable
from .tier_cache import TierStats, register_row_state
from .tier_file import TierFileError

__all__ = ["DiskTier", "EmbeddingBagCollection", "EmbeddingTableConfig", "HashEmbedding", "TensorHashTable",
           "TierFileError", "TierPlan", "TierStats", "register_row_state"]
