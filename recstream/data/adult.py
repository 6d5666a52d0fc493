"""The UCI Adult (census income) data set, shipped with recstream (CC BY 4.0, see datasets/README.md).

48,842 people, 6 numeric and 8 categorical columns; the label is ``income == ">50K"``
(about 24% positive). Numeric columns are standardized with the training split's mean and
standard deviation; categorical vocabularies are the values seen in the file (sorted; id 0
is kept for unknown values).

>>> train, test = load_adult("train"), load_adult("test")
>>> train.num_rows + test.num_rows, train.schema.num_dense, train.schema.num_categorical
(48842, 6, 8)
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..validation import check_bool, check_choice, check_int, check_number
from .convert import ColumnConverter
from .memory import InMemoryDataset
from .schema import CategoricalFeature, DenseFeature, Schema

ADULT_PATH = Path(__file__).resolve().parent / "datasets" / "adult.parquet"
NUMERIC = ("age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = ("workclass", "education", "marital-status", "occupation", "relationship", "race",
               "gender", "native-country")
LABEL = "income"
POSITIVE = ">50K"


@lru_cache(maxsize=1)
def _table() -> pa.Table:
    if not ADULT_PATH.is_file():
        raise FileNotFoundError(f"the Adult data file is missing: {str(ADULT_PATH)!r} (a broken install?)")
    return pq.read_table(ADULT_PATH, columns=list(NUMERIC + CATEGORICAL + (LABEL,)))


def adult_schema(embedding_dim: int = 8) -> Schema:
    """6 dense + 8 categorical features (vocabularies from the data), label ``income``.

    >>> adult_schema().num_embeddings("gender")  # Female, Male + id 0 for unknown
    3
    """
    table = _table()
    cats = [CategoricalFeature(name, vocabulary=sorted(pc.unique(table[name]).drop_null().to_pylist()),
                               embedding_dim=embedding_dim) for name in CATEGORICAL]
    return Schema([DenseFeature(n) for n in NUMERIC], cats, label=LABEL)


def _split_rows(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of a seeded random partition."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    return np.sort(order[n_test:]), np.sort(order[:n_test])  # file order inside each split


def load_adult(split: str = "train", test_fraction: float = 0.2, seed: int = 0, *, batch_size: int = 256,
               shuffle: bool | None = None, embedding_dim: int = 8) -> InMemoryDataset:
    """Train or test split of Adult as an `InMemoryDataset` (``.schema`` attached).

    The split is a seeded random partition; the two splits of one (test_fraction, seed)
    never overlap. ``shuffle`` defaults to True for "train" (a new order each pass).
    """
    check_choice("load_adult", "split", split, ("train", "test"))
    check_number("load_adult", "test_fraction", test_fraction, minimum=0, maximum=1, min_open=True, max_open=True)
    check_int("load_adult", "seed", seed, minimum=0)
    check_int("load_adult", "batch_size", batch_size, minimum=1)
    check_bool("load_adult", "shuffle", shuffle, allow_none=True)
    table = _table()
    train_rows, test_rows = _split_rows(table.num_rows, test_fraction, seed)
    rows = train_rows if split == "train" else test_rows
    schema = adult_schema(embedding_dim)
    columns = {LABEL: pc.cast(pc.equal(table[LABEL], POSITIVE), pa.float32()).take(rows)}
    for name in NUMERIC:  # standardize with training statistics only: no test leakage
        x = table[name].to_numpy().astype(np.float64)
        mean, std = x[train_rows].mean(), x[train_rows].std()
        columns[name] = pa.array(((x[rows] - mean) / (std if std > 0 else 1.0)).astype(np.float32))
    for name in CATEGORICAL:
        columns[name] = table[name].take(rows)
    batch, faults = ColumnConverter(schema).convert(pa.table(columns).combine_chunks())
    if faults:  # the shipped file is clean; anything else means it was altered
        raise ValueError(f"{ADULT_PATH}: unexpected bad row {faults[0]}")
    return InMemoryDataset(batch, batch_size, shuffle=split == "train" if shuffle is None else shuffle,
                           seed=seed, schema=schema)
