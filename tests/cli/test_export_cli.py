"""`recstream export` end to end: the real CLI in a subprocess on a directory publish_version wrote.

The written file is then run by its own runtime and must score as the published network does;
each mistake gets its exit status and one line, without a traceback.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import torch

from recstream.cli import export as export_cli
from recstream.cli.errors import EXIT_FAILURE, EXIT_USAGE
from recstream.data import CategoricalFeature, Features, Schema, SyntheticCTR
from recstream.models import DLRM, WideDeep, default_optimizer
from recstream.serving.export import exporter as export_lib
from recstream.serving.publishing.publish import publish_version
from recstream.serving.snapshot.layout import MODEL_FILE, version_path
from recstream.serving.snapshot.loader import load_latest

# Loading TorchScript the way LibTorch users do: its deprecation warning is not this test's concern.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
GEN = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 20, 30], batch_size=6, seed=5)


def cli(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recstream", "export", *argv], capture_output=True, text=True,
                          timeout=300, env=ENV, cwd=cwd)


def error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, "no message on stderr"
    return lines[-1]


@pytest.fixture
def run_dir(tmp_path):
    """A run directory whose `publish/` holds two versions of a DLRM (the newest is exported)."""
    net = DLRM(GEN.schema, bottom=(8,), top=(8,), embedding_dim=4)
    config = {"bottom": [8], "top": [8], "embedding_dim": 4}
    publish_version(tmp_path / "run" / "publish", net, model_config=config, step=1)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.3)
    publish_version(tmp_path / "run" / "publish", net, model_config=config, step=2)
    return tmp_path / "run"


def features(batch_size: int):
    return next(iter(SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 20, 30],
                                  batch_size=batch_size, seed=batch_size).train_batches(1))).features


def test_onnx_export_of_a_publish_directory_scores_like_the_served_network(run_dir, tmp_path):
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    result = cli(str(run_dir / "publish"), "--format", "onnx", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"recstream export: wrote {out} (onnx, version 2 of {run_dir / 'publish'}): dense float32 [batch, 2], "
        "values int64 [num_ids], offsets int64 [3*batch+1] -> logits float32 [batch]")
    net, manifest = load_latest(run_dir / "publish")
    assert manifest["version"] == 2
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for batch_size in (6, 11):
        x = features(batch_size)
        got = session.run(None, {"dense": x.dense.numpy(), "values": x.values.numpy(), "offsets": x.offsets.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(got[0], net(x).numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("fmt, name", [("exported-program", "model.pt2"), ("torchscript", "model.pt")])
def test_torch_formats_from_a_run_directory(run_dir, tmp_path, fmt, name):
    out = tmp_path / name
    result = cli(str(run_dir), "--format", fmt, "--output", str(out))  # the run dir: its publish/ is found
    assert result.returncode == 0, result.stderr
    assert f"({fmt}, version 2 of {run_dir / 'publish'})" in result.stdout
    module = torch.export.load(str(out)).module() if fmt == "exported-program" else torch.jit.load(str(out))
    net, _ = load_latest(run_dir / "publish")
    x = features(9)
    with torch.no_grad():
        torch.testing.assert_close(module(x.dense, x.values, x.offsets), net(x), rtol=0.0, atol=1e-5)


def test_a_published_model_with_dynamic_features(tmp_path):
    # Dynamic ids are int64 keys of hash tables: the export carries the published keys frozen.
    user = CategoricalFeature("user", dynamic=True, capacity=32, embedding_dim=4, permit_filter_value=2)
    schema = Schema(["x"], [user, CategoricalFeature("item", vocab_size=10, embedding_dim=4)])
    torch.manual_seed(0)
    net = WideDeep(schema, hidden=(8,))
    opt = default_optimizer(net, lr=0.05)
    users = torch.tensor([-1, 7, 10**12, -1, 7, 10**12, 55])  # 55: seen once, pending (not published)
    x = Features.from_lengths(torch.randn(7, 1), torch.cat([users, torch.arange(7)]), torch.ones(2, 7))
    torch.nn.functional.binary_cross_entropy_with_logits(net(x), torch.ones(7)).backward()
    opt.step()
    publish_version(tmp_path / "pub", net, model_config={"hidden": [8]})
    out = tmp_path / "model.pt"
    result = cli(str(tmp_path / "pub"), "--format", "torchscript", "--output", str(out))  # and verified
    assert result.returncode == 0, result.stderr
    served, _ = load_latest(tmp_path / "pub")
    probe = Features.from_lengths(torch.randn(6, 1), torch.tensor([-1, 7, 10**12, 55, -2, 2**60, *range(6)]),
                                  torch.ones(2, 6))
    with torch.no_grad():
        want = served(probe)
        torch.testing.assert_close(torch.jit.load(str(out))(probe.dense, probe.values, probe.offsets), want,
                                   rtol=0.0, atol=1e-5)
        assert torch.equal(want, net.eval()(probe))  # the published table is the trained one
    assert served.embedding.dynamic.tables["user"].num_rows == 3  # 55 was pending: not published, default row


def test_unknown_format_is_a_usage_error(run_dir, tmp_path):
    result = cli(str(run_dir), "--format", "tflite", "--output", str(tmp_path / "m.tflite"))
    assert result.returncode == EXIT_USAGE
    assert "argument --format: invalid choice: 'tflite'" in error_line(result)
    assert "'onnx'" in error_line(result)


def test_a_directory_without_a_version(tmp_path):
    (tmp_path / "empty").mkdir()
    result = cli(str(tmp_path / "empty"), "--format", "torchscript", "--output", str(tmp_path / "m.pt"))
    assert result.returncode == EXIT_USAGE
    assert error_line(result) == (
        f"recstream export: no published version in {str(tmp_path / 'empty')!r} (nor in a sub-directory of it), "
        f"nor a {tmp_path / 'empty' / 'checkpoints'} to export from: give the run_dir of a recstream train or online "
        "run (it holds checkpoints/ and config.yaml), --checkpoint PATH --config CONFIG.yaml, or a publish "
        "directory (a config's publish: section writes one)")
    result = cli(str(tmp_path / "missing"), "--format", "torchscript", "--output", str(tmp_path / "m.pt"))
    assert result.returncode == EXIT_USAGE
    assert error_line(result) == f"recstream export: {tmp_path / 'missing'} does not exist " \
                                 "(export a ModelPublisher's directory, or a run directory)"
    assert sorted(os.listdir(tmp_path)) == ["empty"]


def test_a_directory_whose_versions_are_all_corrupt(run_dir, tmp_path):
    for version in (1, 2):
        with open(os.path.join(version_path(run_dir / "publish", version), MODEL_FILE), "r+b") as f:
            f.truncate(10)
    result = cli(str(run_dir), "--format", "torchscript", "--output", str(tmp_path / "m.pt"))
    assert result.returncode == EXIT_FAILURE
    line = error_line(result)
    assert line.startswith("recstream export: no usable version in") and "v2:" in line and "v1:" in line
    assert not (tmp_path / "m.pt").exists()


def test_output_in_a_missing_directory(run_dir, tmp_path):
    out = tmp_path / "nope" / "m.onnx"
    result = cli(str(run_dir), "--format", "onnx", "--output", str(out))
    assert result.returncode == EXIT_USAGE
    assert error_line(result) == f"recstream export: --output {out}: directory {out.parent} does not exist " \
                                 "(create it first)"
    result = cli(str(run_dir), "--format", "exported-program", "--output", str(tmp_path / "m.pt"))
    assert result.returncode == EXIT_USAGE
    assert error_line(result).endswith("an exported-program file must end in .pt2")


def test_a_network_without_a_rebuild_path_asks_for_a_factory(tmp_path):
    class Custom(WideDeep):  # not a recstream.models class: the manifest alone cannot rebuild it
        pass

    publish_version(tmp_path / "pub", Custom(GEN.schema, hidden=(4,)), verify_rebuild=False)
    result = cli(str(tmp_path / "pub"), "--format", "torchscript", "--output", str(tmp_path / "m.pt"))
    assert result.returncode == EXIT_USAGE
    assert "--model-factory" in error_line(result)


def test_help_is_fast_and_formats_match_the_library():
    assert export_cli.FORMATS == export_lib.FORMATS
    code = ("import sys\nfrom recstream.cli.main import main\n"
            "try:\n    main(['export', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "False", result.stdout + result.stderr
    assert "``" not in result.stdout and "offsets int64 [F*B+1]" in result.stdout


TRAIN = """run_dir: run
schema:
  criteo: {hash_buckets: 1000, embedding_dim: 4}
data:
  train: {format: criteo, path: data/part-00000000.tsv, batch_size: 100}
model:
  type: widedeep
  hidden: [8]
train:
  epochs: 2
  threads: 1
callbacks:
  checkpoint: {every_steps: 3}
"""


def criteo_instance(fields: list[str]) -> dict:
    """A raw Criteo row as a /predict instance: empty counts null, hashed ids as their text."""
    return {f"I{i}": float(fields[i]) if fields[i] else None for i in range(1, 14)} | {
        f"C{i}": fields[13 + i] or None for i in range(1, 27)}


def test_an_offline_run_without_publish_exports_its_newest_checkpoint(tmp_path):
    from recstream.checkpoint import load_checkpoint
    from recstream.cli.main import main
    from recstream.data import CriteoReader
    from recstream.serving.export import instances_to_inputs, read_signature
    assert main(["produce", "--synthetic", "--format", "criteo", "--no-meta", "--rows", "300", "--seed", "1",
                 "--directory", str(tmp_path / "data"), "--file-records", "300"]) == 0
    (tmp_path / "c.yaml").write_text(TRAIN)
    trained = subprocess.run([sys.executable, "-m", "recstream", "train", "c.yaml"], capture_output=True, text=True,
                             timeout=300, env=ENV, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    checkpoints = sorted((tmp_path / "run" / "checkpoints").glob("*.safetensors"), key=os.path.getmtime)
    assert len(checkpoints) == 2  # one per epoch (3 steps): the newest (epoch 2) is exported
    result = cli("run", "--format", "torchscript", "--output", "m.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"recstream export: wrote m.pt (torchscript, checkpoint {checkpoints[-1]}, "
                                    "epoch 2, step 6): dense float32 [batch, 13]"), result.stdout
    sig = read_signature(tmp_path / "m.pt", "torchscript")
    assert sig["preprocessing"] == {"fill_missing_dense": 0.0, "log1p_dense": True}  # the Criteo reader's
    net = WideDeep(Schema.from_dict(sig["schema"]), hidden=[8])
    load_checkpoint(checkpoints[-1], net, restore_rng=False)
    path = tmp_path / "data" / "part-00000000.tsv"
    rows = [line.split("\t") for line in path.read_text().splitlines()[:5]]
    inputs = instances_to_inputs(sig, [criteo_instance(r) for r in rows])
    read = next(iter(CriteoReader(str(path), 5, 1000, embedding_dim=4))).features  # as training read them
    with torch.no_grad():
        want = net.eval()(read)
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "m.pt"))(*inputs), want, rtol=0.0, atol=1e-5)

    # --checkpoint names another one (the run's config.yaml rebuilds the network)
    result = cli("run", "--checkpoint", str(checkpoints[0]), "--format", "torchscript", "--output", "m1.pt",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"checkpoint {checkpoints[0]}, epoch 1, step 3" in result.stdout
    load_checkpoint(checkpoints[0], net, restore_rng=False)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "m1.pt"))(*inputs), net.eval()(read),
                                   rtol=0.0, atol=1e-5)

    # without its config, the error says what to add
    os.rename(tmp_path / "run" / "config.yaml", tmp_path / "elsewhere.yaml")
    result = cli("run", "--format", "torchscript", "--output", "m2.pt", cwd=tmp_path)
    assert result.returncode == EXIT_USAGE
    assert error_line(result) == (f"recstream export: {os.path.join('run', 'checkpoints')} holds the checkpoints but "
                                  f"{os.path.join('run', 'config.yaml')} does not exist: give the config that "
                                  "trained them with --config CONFIG.yaml")
    result = cli("run", "--config", "elsewhere.yaml", "--format", "torchscript", "--output", "m2.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_checkpoint_argument_mistakes_are_usage_errors(tmp_path):
    import argparse
    parser = argparse.ArgumentParser(prog="recstream")
    export_cli.add_parser(parser.add_subparsers(dest="command"))
    ckpt = str(tmp_path / "model-1_3.safetensors")
    (tmp_path / "model-1_3.safetensors").write_bytes(b"")
    for argv, words in (
            ([], "give DIR (a publish or run directory) or --checkpoint PATH --config CONFIG.yaml"),
            (["--checkpoint", ckpt], "--checkpoint needs the config that trained it"),
            (["--checkpoint", str(tmp_path / "no.safetensors"), "--config", "c.yaml"], "no.safetensors does not exist"),
            ([str(tmp_path), "--checkpoint", str(tmp_path), "--model-factory", "m:f"], "--model-factory rebuilds")):
        args = parser.parse_args(["export", *argv, "--format", "torchscript", "--output", str(tmp_path / "m.pt")])
        with pytest.raises(export_cli.CliError) as e:
            export_cli.run(args)
        assert e.value.code == EXIT_USAGE and words in str(e.value), (argv, str(e.value))
