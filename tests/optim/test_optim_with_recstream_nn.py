"""recstream.optim with the real recstream.nn embedding modules."""

import functools

import torch
from torch import nn

from recstream.nn import EmbeddingBagCollection, EmbeddingTableConfig, HashEmbedding
from recstream.optim import LazyAdam, RowWiseAdagrad, sparse_and_dense, split_sparse_dense


def test_hash_embedding_reassigned_row_gets_fresh_state():
    emb = HashEmbedding(3, capacity=4)
    opt = LazyAdam(emb.parameters(), lr=0.1)
    for _ in range(3):
        emb(torch.tensor([1, 2, 3, 4])).sum().backward()
        opt.step()
        opt.zero_grad()
    # Key 5 does not fit: the least recently used key's row is reassigned.
    out = emb(torch.tensor([5, 2]))
    reused = emb.reset_mask.nonzero().flatten()
    assert reused.numel() == 1
    out.sum().backward()
    opt.step()
    m = opt.state[emb.values]["exp_avg"]
    kept = m[[r for r in range(4) if r != reused.item()]]
    torch.testing.assert_close(m[reused], torch.full((1, 3), 0.1))  # (1-beta1) * grad only
    assert (kept > 0.25).all()  # other rows kept their accumulated moments
    assert emb.values.pop_reset_rows().numel() == 0  # the optimizer consumed the record


class CTR(nn.Module):
    def __init__(self, num_features=3, batch=16):
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            [EmbeddingTableConfig(f"t{i}", 30, 4) for i in range(num_features)], sparse=True)
        self.hashed = HashEmbedding(4, capacity=64)
        self.head = nn.Linear(4 * num_features + 4, 1)

    def forward(self, values, offsets, batch_size, keys):
        x = torch.cat([self.ebc(values, offsets, batch_size), self.hashed(keys)], dim=1)
        return self.head(x).squeeze(1)


def test_split_and_train_with_embedding_bag_collection_and_hash_embedding():
    torch.manual_seed(0)
    model = CTR()
    sparse, dense = split_sparse_dense(model)
    assert {id(p) for p in sparse} == {id(model.ebc.fused_weight_dim4), id(model.hashed.values)}
    assert {id(p) for p in dense} == {id(model.head.weight), id(model.head.bias)}
    opt = sparse_and_dense(model, sparse=functools.partial(RowWiseAdagrad, lr=0.2),
                           dense=functools.partial(torch.optim.Adam, lr=0.02))
    gen = torch.Generator().manual_seed(1)
    B, F = 16, 3
    data = []
    for _ in range(4):
        values = torch.randint(0, 30, (F * B,), generator=gen)
        keys = torch.randint(0, 40, (B,), generator=gen)
        y = ((values[:B] + keys) % 2).float()
        data.append((values, torch.arange(F * B + 1), keys, y))
    losses = []
    for _ in range(40):
        for values, offsets, keys, y in data:
            loss = nn.functional.binary_cross_entropy_with_logits(
                model(values, offsets, B, keys), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            assert model.ebc.fused_weight_dim4.grad.is_sparse
            opt.step()
            losses.append(loss.item())
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])
