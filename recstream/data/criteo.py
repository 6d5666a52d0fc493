"""The Criteo display-advertising TSV format (Kaggle / Terabyte click logs).

Each line: ``label \\t I1..I13 \\t C1..C26`` - a 0/1 click label, 13 integer counts and 26
categorical ids as 8-digit hex strings; any field may be empty. Empty counts become 0 and
then (by default) ``log1p(max(x, 0))``, the usual transform for these heavy-tailed counts;
hex ids are hashed into ``hash_buckets`` with id 0 reserved for an empty field.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "day_0.tsv")
>>> line = "\\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26)
>>> _ = open(path, "w").write(line + "\\n" + line.replace("\\t3\\t", "\\t\\t", 1) + "\\n")
>>> (features, labels), = CriteoReader(path, batch_size=4, hash_buckets=1000)
>>> features.dense.shape, labels.tolist(), features.values.shape
(torch.Size([2, 13]), [1.0, 1.0], torch.Size([52]))
"""
from __future__ import annotations

import os
from typing import Sequence

from .csv_reader import CSVReader
from .schema import CategoricalFeature, DenseFeature, Schema

NUM_DENSE = 13
NUM_CATEGORICAL = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
COLUMNS = ("label",) + DENSE_NAMES + CATEGORICAL_NAMES
DEFAULT_HASH_BUCKETS = 100_000  # 26 tables x 100k x 16 floats = 166 MB: fits a CPU run


def criteo_schema(hash_buckets: int | Sequence[int] = DEFAULT_HASH_BUCKETS, embedding_dim: int = 16) -> Schema:
    """Schema of the Criteo columns: dense I1..I13, hashed categorical C1..C26.

    `hash_buckets` is one size for all 26 features or one per feature.

    >>> s = criteo_schema(1000, embedding_dim=8)
    >>> s.num_dense, s.num_categorical, s.num_embeddings("C26")
    (13, 26, 1000)
    """
    if isinstance(hash_buckets, int) and not isinstance(hash_buckets, bool):
        sizes = [hash_buckets] * NUM_CATEGORICAL
    elif isinstance(hash_buckets, Sequence) and not isinstance(hash_buckets, str):
        sizes = list(hash_buckets)
        if len(sizes) != NUM_CATEGORICAL:
            raise ValueError(f"criteo_schema: 'hash_buckets' needs {NUM_CATEGORICAL} sizes, got {len(sizes)}")
    else:
        raise TypeError(f"criteo_schema: 'hash_buckets' must be an int or a sequence of 26 ints, "
                        f"got {hash_buckets!r}")
    cats = [CategoricalFeature(name, hash_buckets=n, embedding_dim=embedding_dim)
            for name, n in zip(CATEGORICAL_NAMES, sizes)]
    return Schema([DenseFeature(n) for n in DENSE_NAMES], cats, label="label")


class CriteoReader(CSVReader):
    """Batches from Criteo TSV file(s) (plain or ``.gz``), streamed in constant memory.

    Bad rows (wrong field count, non-numeric count, NaN/inf, label not 0/1) follow
    ``on_bad_row`` like any :class:`CSVReader`. ``schema`` holds the matching schema.
    """

    _suffixes = (".tsv", ".txt", ".csv", ".tsv.gz", ".txt.gz", ".gz")

    def __init__(self, path, batch_size: int, hash_buckets: int | Sequence[int] = DEFAULT_HASH_BUCKETS, *,
                 embedding_dim: int = 16, log1p: bool = True, drop_remainder: bool = False,
                 on_bad_row: str = "raise", bad_row_log: str | os.PathLike | None = None,
                 block_size: int = 1 << 22) -> None:
        super().__init__(path, criteo_schema(hash_buckets, embedding_dim), batch_size, delimiter="\t",
                         header=False, column_names=COLUMNS, drop_remainder=drop_remainder,
                         on_bad_row=on_bad_row, bad_row_log=bad_row_log, fill_missing_dense=0.0,
                         log1p_dense=log1p, quote_char=False, block_size=block_size)
        self.log1p = bool(log1p)
