"""A model with cross features scores a request exactly as training did: trained on rows read from a
CSV file, published, served by a real server on a socket (whose parser computes the crosses from the
raw fields), and exported (TorchScript, ONNX) fed by `instances_to_inputs`."""
from __future__ import annotations

import http.client
import json
import threading

import pytest
import torch
from torch import nn

from recstream.data import CategoricalFeature, CrossFeature, CSVReader, Schema
from recstream.models import WideDeep, default_optimizer
from recstream.serving import ModelHolder, make_server, publish_version
from recstream.serving.export import export_published, instances_to_inputs, read_signature

from .test_self_contained import SUFFIX, predict, run

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
ROWS = [
    {"clicks": 3, "user": "alice", "item": 7, "city": "paris", "genre": ["drama", "noir"]},
    {"clicks": 0, "user": "bob", "item": 3, "city": "oslo", "genre": ["comedy"]},
    {"clicks": 12, "user": "carol", "item": 7, "city": "paris", "genre": []},
    {"clicks": 1, "user": "alice", "item": 9, "city": "rome", "genre": ["noir"]},
    {"clicks": 5, "user": "dave", "item": 3, "city": "oslo", "genre": ["drama", "comedy", "noir"]},
]


def schema(vocabulary: bool) -> Schema:
    genre = (CategoricalFeature("genre", vocabulary=["drama", "comedy", "noir"], embedding_dim=4, multi_hot=True)
             if vocabulary else CategoricalFeature("genre", hash_buckets=31, embedding_dim=4, multi_hot=True))
    return Schema(["clicks"], [CategoricalFeature("user", hash_buckets=100, embedding_dim=4),
                               CategoricalFeature("item", vocab_size=10, embedding_dim=4),
                               CategoricalFeature("city", dynamic=True, capacity=20, embedding_dim=4), genre],
                  crosses=[CrossFeature("user_x_genre", ("user", "genre"), hash_buckets=997),
                           CrossFeature("item_x_city", ("item", "city"), hash_buckets=101, embedding_dim=4, deep=True)])


def write_csv(path, rows, labels) -> None:
    lines = ["label,clicks,user,item,city,genre"]
    lines += [f"{y},{r['clicks']},{r['user']},{r['item']},{r['city']},{'|'.join(r['genre'])}"
              for r, y in zip(rows, labels, strict=True)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(params=[False, True], ids=["direct-parser", "converter-parser"])
def trained(request, tmp_path):
    """(network trained on the CSV rows, its schema, the CSV of ROWS, tmp_path)."""
    s = schema(request.param)
    torch.manual_seed(0)
    net = WideDeep(s, hidden=(8,))
    opt, loss_fn = default_optimizer(net, lr=0.05, wide_lr=0.5), nn.BCEWithLogitsLoss()
    write_csv(tmp_path / "train.csv", ROWS * 4, [1, 0, 1, 1, 0] * 4)
    # 3 passes (were 20): since default_optimizer's tables lr 0.1 and FTRL accumulators from 1e-6, 20 passes
    # saturate the scores (five scores, three distinct values at 6 decimals), which the check below needs not to
    for _ in range(3):
        for b in CSVReader(str(tmp_path / "train.csv"), s, batch_size=10, log1p_dense=True):
            opt.zero_grad()
            loss_fn(net(b.features), b.labels).backward()
            opt.step()
    assert bool((net.wide.ebc.table_weight("user_x_genre") != 0).any())  # the crosses did train
    write_csv(tmp_path / "score.csv", ROWS, [0] * len(ROWS))
    return net, s, tmp_path


def training_scores(net, s, csv) -> list[float]:
    """What the training network says for the rows, read by the training reader."""
    (b,) = list(CSVReader(str(csv), s, batch_size=len(ROWS), log1p_dense=True))
    net.eval()
    with torch.no_grad():
        return torch.sigmoid(net(b.features)).tolist()


@pytest.fixture
def server(trained):
    net, s, tmp = trained
    publish_version(tmp / "pub", net, model_config={"hidden": [8]}, preprocessing={"log1p_dense": True})
    holder = ModelHolder(tmp / "pub")
    assert holder.refresh()
    srv = make_server(holder, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def get_schema(srv) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    try:
        conn.request("GET", "/schema")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def test_the_server_scores_crossed_requests_as_training_did(trained, server):
    net, s, tmp = trained
    want = training_scores(net, s, tmp / "score.csv")
    got = predict(server, ROWS)
    assert got == pytest.approx(want, abs=1e-6)
    assert len({round(v, 6) for v in want}) == len(want)
    assert get_schema(server)["crosses"] == [x.to_dict() for x in s.crosses]
    # the crosses matter: the same network without its cross weights answers otherwise
    with torch.no_grad():
        net.wide.ebc.table_weight("user_x_genre").zero_()
    assert training_scores(net, s, tmp / "score.csv") != pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("fmt", ["torchscript", pytest.param("onnx", marks=pytest.mark.e2e)])
def test_an_export_fed_by_the_helper_scores_as_training_did(fmt, trained, server):
    net, s, tmp = trained
    path = str(tmp / f"model.{SUFFIX[fmt]}")
    export_published(tmp / "pub", path, fmt)
    sig = read_signature(path, fmt)
    assert Schema.from_dict(sig["schema"]) == s
    want = training_scores(net, s, tmp / "score.csv")
    got = torch.sigmoid(run(path, fmt, instances_to_inputs(sig, ROWS))).tolist()
    assert got == pytest.approx(want, abs=1e-6)
    assert predict(server, ROWS) == pytest.approx(got, abs=1e-6)
