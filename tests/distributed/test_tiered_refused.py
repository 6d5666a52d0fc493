"""Disk-tiered tables train on one process: data_parallel and hybrid_parallel refuse them up front,
before any collective, naming the tables (replicated, each rank's cache slots hold other rows, so an
all-reduce of slot gradients would add up different rows: a silent wrong model)."""
import pytest

from recstream.data import CategoricalFeature, Schema
from recstream.distributed import data_parallel, hybrid_parallel
from recstream.models import WideDeep
from recstream.nn import TierPlan


@pytest.mark.parametrize("mode", [data_parallel, hybrid_parallel])
def test_parallel_modes_refuse_disk_tiered_tables_naming_them(tmp_path, mode):
    schema = Schema(["x"], [CategoricalFeature("a", vocab_size=100), CategoricalFeature("b", vocab_size=10)])
    net = WideDeep(schema, hidden=(4,), disk_tier=TierPlan(str(tmp_path), {"a": 16}))
    # No process group exists: the refusal comes before any collective would need one.
    tables = r"\['wide\.ebc\.a', 'embedding\.ebc\.a'\]"
    with pytest.raises(ValueError, match=rf"{mode.__name__}: disk-tiered tables {tables} train on one process only"
                                         r".*keep them in memory and use parallel_mode='hybrid_parallel'"):
        mode(net)
