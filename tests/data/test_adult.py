from pathlib import Path

import numpy as np
import pytest
import torch

from recstream.data import adult_schema, load_adult, roc_auc
from recstream.data.adult import ADULT_PATH


def test_files_and_attribution_ship_together():
    readme = Path(ADULT_PATH).parent / "README.md"
    assert ADULT_PATH.is_file() and readme.is_file()
    text = readme.read_text()
    assert "Becker, B. & Kohavi, R. (1996)" in text and "CC BY 4.0" in text


def test_schema():
    s = adult_schema(embedding_dim=4)
    assert s.dense_names == ("age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week")
    assert len(s.categorical) == 8 and s.label == "income"
    assert s.feature("gender").vocabulary == ("Female", "Male")
    assert s.num_embeddings("native-country") == 42 + 1 and s.feature("race").embedding_dim == 4


def test_splits():
    train, test = load_adult("train", batch_size=1024), load_adult("test", batch_size=1024)
    assert train.num_rows + test.num_rows == 48842 and test.num_rows == round(48842 * 0.2)
    assert train.schema == adult_schema() and train.shuffle and not test.shuffle
    (f, y), = load_adult("test", test_fraction=0.01, batch_size=1000)
    f.validate(adult_schema())
    assert set(y.unique().tolist()) <= {0.0, 1.0}
    all_train = next(iter(load_adult("train", batch_size=10 ** 6, shuffle=False)))
    dense = all_train.features.dense
    np.testing.assert_allclose(dense.mean(0).numpy(), 0, atol=1e-4)  # standardized on train statistics
    np.testing.assert_allclose(dense.std(0).numpy(), 1, atol=1e-3)
    assert 0.2 < float(all_train.labels.mean()) < 0.28
    ids = all_train.features.values.view(8, -1)
    assert int(ids.min()) >= 1  # every value is in the vocabulary: id 0 (unknown) unused


def test_splits_do_not_overlap_and_depend_on_seed():
    def rows(split, seed):
        b = next(iter(load_adult(split, seed=seed, batch_size=10 ** 6, shuffle=False)))
        return {tuple(r) for r in torch.cat([b.features.dense, b.features.values.view(8, -1).T.float()], 1).tolist()}
    train, test = rows("train", 0), rows("test", 0)
    assert len(train & test) < 0.01 * len(test)  # only rare exact duplicate people in the raw data
    assert rows("test", 1) != test


def test_shuffled_passes_differ_but_hold_the_same_rows():
    ds = load_adult("test", batch_size=512, shuffle=True)
    a = torch.cat([b.labels for b in ds])
    b = torch.cat([b.features.dense[:, 0] for b in ds])
    c = torch.cat([b.features.dense[:, 0] for b in ds])
    assert not torch.equal(b, c) and torch.equal(b.sort().values, c.sort().values)
    assert len(a) == ds.num_rows


def test_linear_model_learns_it():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        train, test = load_adult("train", batch_size=512), load_adult("test", batch_size=4096)
        sizes = train.schema.table_sizes()
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        emb = torch.nn.EmbeddingBag(sum(sizes), 1, mode="sum", include_last_offset=True)
        lin = torch.nn.Linear(6, 1)
        opt = torch.optim.Adam(list(emb.parameters()) + list(lin.parameters()), lr=0.05)

        def score(f):
            return emb(f.fused_ids(offsets), f.offsets).view(8, -1).sum(0) + lin(f.dense).squeeze(-1)

        for _ in range(2):
            for f, y in train:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(score(f), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            s = torch.cat([score(f) for f, _ in test])
        assert roc_auc(s.numpy(), torch.cat([y for _, y in test]).numpy()) > 0.88
    finally:
        torch.set_num_threads(n)


def test_bad_arguments():
    with pytest.raises(ValueError, match="load_adult: 'split' must be one of \\['train', 'test'\\], got 'val'"):
        load_adult("val")
    with pytest.raises(ValueError, match="load_adult: 'test_fraction' must be a finite number > 0 and < 1, got 1.5"):
        load_adult("test", test_fraction=1.5)
