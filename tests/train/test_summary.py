"""Model.summary(): modules, parameters, bytes, embedding tables and optimizer state."""
import torch
from torch import nn

from recstream import Model
from recstream.data import SyntheticCTR
from recstream.models import WideDeep, default_optimizer


def test_summary_of_a_plain_network_counts_parameters_bytes_and_optimizer_state():
    net = nn.Sequential(nn.Embedding(1000, 8), nn.Flatten(), nn.Linear(16, 1))
    net[2].weight.requires_grad_(False)
    model = Model(net, nn.MSELoss(), torch.optim.Adam(net.parameters()))
    text = model.summary(print_fn=None)
    lines = text.splitlines()
    assert lines[1].split() == ["0", "Embedding", "8,000", "8,000", "31.2", "KiB"]
    assert lines[4].split()[:4] == ["total", "8,017", "8,001", "31.3"]
    assert ["0", "1,000", "8", "31.2", "KiB", "False"] in [line.split() for line in lines]
    assert "optimizer Adam: state 0 B (created at the first step)" in text
    model.train_network(torch.randint(0, 1000, (4, 2)), torch.zeros(4, 1))
    assert "optimizer Adam: state 62.5 KiB" in model.summary(print_fn=None)  # 2 moments of 8,001 floats + steps


def test_summary_lists_the_tables_of_recstream_models(capsys):
    gen = SyntheticCTR(num_dense=2, num_categorical=2, vocab_sizes=[50, 7], batch_size=8)
    net = WideDeep(gen.schema, hidden=(8,), embedding_dim=4)
    Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net)).summary()
    out = capsys.readouterr().out
    assert "embedding table" in out and "optimizer CombinedOptimizer" in out
    assert ["embedding.ebc.C1", "50", "4", "800", "B", "True"] in [line.split() for line in out.splitlines()]
