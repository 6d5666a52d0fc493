"""Disk-tiered tables that a parallel mode cannot train are refused up front, before any collective,
naming the tables: data_parallel refuses every tiered table (replicated, each rank's cache slots hold
other rows, so an all-reduce of slot gradients would add up different rows: a silent wrong model);
hybrid_parallel refuses tiered EmbeddingBagCollection tables and HashEmbeddings built in a single
process (their stores hold every row, not a rank's). hybrid_parallel's training of tiered tables on two
ranks: test_tier_sharding.py, test_hash_tier_sharding.py."""
import pytest
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.distributed import data_parallel, hybrid_parallel
from recstream.models import WideDeep
from recstream.nn import DiskTier, HashEmbedding, TierPlan


def _net(tmp_path):
    schema = Schema(["x"], [CategoricalFeature("a", vocab_size=100), CategoricalFeature("b", vocab_size=10)])
    return WideDeep(schema, hidden=(4,), disk_tier=TierPlan(str(tmp_path), {"a": 16}))


def test_data_parallel_refuses_disk_tiered_tables_naming_them(tmp_path):
    # No process group exists: the refusal comes before any collective would need one.
    tables = r"\['wide\.ebc\.a', 'embedding\.ebc\.a'\]"
    with pytest.raises(ValueError, match=rf"data_parallel: disk-tiered tables {tables} train on one process only"
                                         r".*use parallel_mode='hybrid_parallel', which gives each rank a store of "
                                         r"its own rows"):
        data_parallel(_net(tmp_path))


def test_hybrid_parallel_refuses_tables_whose_stores_hold_every_row(tmp_path):
    with pytest.raises(ValueError, match=r"hybrid_parallel \(wide\.ebc\): disk-tiered tables \['a'\] were built in a "
                                         r"single process, their stores hold every row; build the network after "
                                         r"joining the process group"):
        hybrid_parallel(_net(tmp_path))


def test_hybrid_parallel_refuses_a_disk_tiered_hash_embedding_whose_store_holds_every_key(tmp_path):
    # Built in one process, its store holds every key's rows; a key-sharded one keeps a store per rank
    # (test_hash_tier_sharding.py). No process group exists: refused before any collective would need one.
    users = torch.nn.ModuleDict({"users": HashEmbedding(4, capacity=64, tier=DiskTier(str(tmp_path), cache_rows=16))})
    with pytest.raises(ValueError, match=r"hybrid_parallel \(users\): the disk-tiered HashEmbedding \(tier=DiskTier"
                                         r"\(.*\)\) was built in a single process, its store holds every key's rows; "
                                         r"build the network after joining the process group"):
        hybrid_parallel(users)
