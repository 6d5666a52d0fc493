"""ModelPublisher under hybrid_parallel: every rank takes part in each version (the dense state's gathers of
the row-sharded tables, each rank's keys' rows of a key-sharded HashEmbedding gathered to rank 0), rank 0
writes it. Online training with a publisher finishes (it hung: rank 0 alone waited in the gather of
``state_dict()``); each published version, full or delta, loads into exactly the network trained to its
step (every gathered table, every rank's keys' rows), and the served model scores as the trained one; a
divergence on one rank and a failed write stop or spare every rank alike, none waits forever."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recstream.nn.key_sharding import owner_of
from recstream.serving import ModelHolder
from recstream.serving.snapshot.layout import list_versions, read_latest, read_manifest
from recstream.serving.snapshot.loader import load_version
from recstream.serving.snapshot.state_split import ROW_FIELDS, dense_state, hash_embeddings, sort_rows

from .publish_worker import INSTANCES, STEPS

pytestmark = pytest.mark.e2e  # torchrun jobs (tier 2: python -m pytest -m e2e)
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("publish_worker.py")


def _torchrun(out: Path, action: str) -> dict[int, tuple[int, list[int]]]:
    """Run the worker on 2 gloo ranks (a hang fails the test); every rank's (failures, versions)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(WORKER),
           str(out), action]
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = run.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGTERM)  # torchrun stops its workers (each in a session of its own) on SIGTERM
        try:
            run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate()
        raise AssertionError(f"{action}: the ranks did not finish in 240 s (one waiting alone in a collective)") \
            from None
    assert run.returncode == 0, stderr[-4000:]
    lines = re.findall(r"^done (\d) (\d+) \[([\d, ]*)\]$", stdout, re.M)
    assert len(lines) == 2, stdout
    return {int(r): (int(f), [int(v) for v in vs.split(",") if v.strip()]) for r, f, vs in lines}


def _union(out: Path, step: int, path: str) -> dict[str, torch.Tensor]:
    """Every rank's rows of HashEmbedding `path` at `step`, each key on the rank owner_of names."""
    parts = []
    for rank in (0, 1):
        rows = {k[len(path) + 1:]: v for k, v in load_file(out / f"step{step}-rows-{rank}.safetensors").items()
                if k.startswith(path + ".")}
        assert (owner_of(rows["keys"], 2) == rank).all()
        parts.append(rows)
    return sort_rows({f: torch.cat([p[f] for p in parts]) for f in ROW_FIELDS})


def _versions_equal_the_trained_network(out: Path) -> list[str]:
    """Each version taken at a recorded step loads into the network as trained to that step; its kinds."""
    pub, kinds = out / "pub", []
    for version in list_versions(pub):
        manifest = read_manifest(pub, version)
        dense = out / f"step{manifest['step']}-dense.safetensors"
        if not dense.exists():  # a background write deferred it to an odd step: no record of that one
            continue
        net, _ = load_version(pub, version)
        want, got = load_file(dense), dense_state(net)
        assert sorted(got) == sorted(want)
        for name, value in want.items():  # every table gathered from both ranks, and the dense layers
            assert torch.equal(got[name], value), (version, name)
        for path, emb in hash_embeddings(net).items():
            loaded, trained = sort_rows(emb.export(reset_delta=False)), _union(out, manifest["step"], path)
            assert trained["keys"].numel() > 20
            for field in ROW_FIELDS:
                assert torch.equal(loaded[field], trained[field]), (version, path, field)
        kinds.append(manifest["kind"])
    return kinds


def _served_scores(pub: Path) -> list[float]:
    holder = ModelHolder(pub)
    assert holder.refresh()
    served = holder.current
    features = served.parser.parse({"instances": [{k: v for k, v in i.items() if k in served.parser.schema.columns}
                                                  for i in INSTANCES]})
    with torch.no_grad():
        return torch.sigmoid(served.model(features)).flatten().tolist()


def _scores_as_trained(out: Path) -> None:
    trained = [json.loads((out / f"scores-{r}.json").read_text()) for r in (0, 1)]
    assert trained[0] == trained[1]
    assert _served_scores(out / "pub") == trained[0]


def test_fixed_tables_publish_the_gathered_tables_in_the_background(tmp_path):
    done = _torchrun(tmp_path, "fixed")
    pub = tmp_path / "pub"
    versions = list_versions(pub)
    assert done[0] == (0, versions) and done[1] == (0, [])  # rank 0 wrote every version, rank 1 none
    assert read_manifest(pub, versions[-1])["step"] == STEPS and read_latest(pub) == versions[-1]
    assert sorted(os.listdir(pub)) == ["LATEST"] + [f"v{v:08d}" for v in versions]
    kinds = _versions_equal_the_trained_network(tmp_path)
    assert kinds and set(kinds) == {"full"}  # no HashEmbedding: every version is full
    _scores_as_trained(tmp_path)


def test_every_seconds_is_decided_together(tmp_path):
    done = _torchrun(tmp_path, "seconds")
    pub = tmp_path / "pub"
    versions = list_versions(pub)
    # rank 0 wrote every version (retention keeps the newest 5), rank 1 none
    assert done[0][0] == 0 and done[0][1][-len(versions):] == versions and done[1] == (0, [])
    assert len(done[0][1]) >= 2 and read_manifest(pub, versions[-1])["step"] == STEPS  # the last: the trained network
    _scores_as_trained(tmp_path)


@pytest.mark.parametrize("action", ["dynamic", "tiered"])
def test_a_key_sharded_hash_embedding_publishes_the_union_of_the_ranks_full_and_delta(tmp_path, action):
    done = _torchrun(tmp_path, action)
    pub = tmp_path / "pub"
    assert done[0] == (0, [1, 2, 3, 4]) and done[1] == (0, [])
    assert [read_manifest(pub, v)["step"] for v in (1, 2, 3, 4)] == [2, 4, 6, 8]
    assert _versions_equal_the_trained_network(tmp_path) == ["full", "delta", "delta", "delta"]
    delta = read_manifest(pub, 4)["hash_embeddings"]
    full = read_manifest(pub, 1)["hash_embeddings"]
    assert list(delta) == list(full) and all(0 < delta[p]["rows"] < _union(tmp_path, 8, p)["keys"].numel()
                                             for p in delta)
    _scores_as_trained(tmp_path)
    if action == "tiered":  # each rank's rows of each tiered table in a store of its own
        for table in ("embedding/user", "embedding/item", "wide/item"):
            assert sorted(os.listdir(tmp_path / "tiers" / table)) == ["rank-0-of-2", "rank-1-of-2"]


def test_a_divergence_on_one_rank_stops_every_rank(tmp_path):
    done = _torchrun(tmp_path, "diverge")
    assert done[0] == (1, []) and done[1] == (1, [])
    errors = [(tmp_path / f"error-{r}.txt").read_text() for r in (0, 1)]
    assert errors[0].startswith("DivergenceError: training diverged on rank(s) [1] (a non-finite loss or weight); "
                                "refusing to publish a version to"), errors[0]
    assert errors[1].startswith("DivergenceError: training diverged: the loss became non-finite (NaN or inf) at "
                                "step 3"), errors[1]
    assert list_versions(tmp_path / "pub") == []


def test_a_failed_write_is_every_ranks_and_training_goes_on(tmp_path):
    done = _torchrun(tmp_path, "unwritable")
    assert done[0] == (1, [1, 2, 3]) and done[1] == (1, [])  # step 4's publish failed on both; 2, 6 and 8 written
    pub = tmp_path / "pub"
    assert [(read_manifest(pub, v)["step"], read_manifest(pub, v)["kind"]) for v in (1, 2, 3)] == [
        (2, "full"), (6, "full"), (8, "delta")]  # after a failure the next version is full


def test_an_unusable_directory_stops_every_rank_at_the_start(tmp_path):
    done = _torchrun(tmp_path, "blocked")
    assert done[0] == (0, []) and done[1] == (0, [])
    errors = [(tmp_path / f"error-{r}.txt").read_text() for r in (0, 1)]
    assert errors[0].startswith("FileExistsError"), errors[0]
    assert errors[1] == (f"ShardedPublishError: could not prepare the publish directory {str(tmp_path / 'pub')!r}: "
                         "it failed on rank(s) [0] (see that rank's log)"), errors[1]
