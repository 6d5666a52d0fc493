"""`recstream serve` argument handling (the running server is tested in test_hot_swap.py)."""
import argparse

import pytest

from recstream.cli import serve
from recstream.serving import SnapshotWriter

from ..helpers import CONFIG, SCHEMA, new_model


def parse(*argv):
    parser = argparse.ArgumentParser(prog="recstream")
    serve.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def test_defaults_and_options():
    args = parse("models", "--port", "8080")
    assert (args.directory, args.port, args.host, args.max_body_bytes, args.poll_seconds) == (
        "models", 8080, "127.0.0.1", 1 << 20, 0.05)
    assert args.run is serve.run
    args = parse("m", "--port", "0", "--host", "0.0.0.0", "--max-body-bytes", "100", "--poll-seconds", "0.5",
                 "--model-factory", "pkg.mod:fn", "--max-instances", "7")
    assert (args.host, args.max_body_bytes, args.poll_seconds, args.model_factory, args.max_instances) == (
        "0.0.0.0", 100, 0.5, "pkg.mod:fn", 7)


def test_serving_stack_options():
    args = parse("m", "--port", "0")
    assert (args.max_batch_rows, args.max_batch_wait_ms, args.request_timeout, args.max_connections, args.backlog) == (
        256, 2.0, 30.0, 4096, 2048)
    args = parse("m", "--port", "0", "--max-batch-rows", "8", "--max-batch-wait-ms", "0", "--request-timeout", "2.5",
                 "--max-connections", "10", "--backlog", "64")
    assert (args.max_batch_rows, args.max_batch_wait_ms, args.request_timeout, args.max_connections, args.backlog) == (
        8, 0.0, 2.5, 10, 64)


@pytest.mark.parametrize("argv", [["m"], ["m", "--port", "70000"], ["m", "--port", "1", "--max-body-bytes", "0"],
                                  ["m", "--port", "1", "--poll-seconds", "-1"],
                                  ["m", "--port", "1", "--max-batch-rows", "0"],
                                  ["m", "--port", "1", "--max-batch-wait-ms", "-1"],
                                  ["m", "--port", "1", "--request-timeout", "0"],
                                  ["m", "--port", "1", "--backlog", "0"]])
def test_bad_arguments_exit(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2


def test_unbuildable_model_exits_2_with_a_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(serve.logging, "basicConfig", lambda **kw: None)  # keep the test session's logging
    net, _ = new_model()
    SnapshotWriter(tmp_path, SCHEMA, model_config=CONFIG).publish(net)  # custom class, no factory
    assert serve.run(parse(str(tmp_path), "--port", "0")) == 2
    assert "pass model_factory" in capsys.readouterr().err
    assert serve.run(parse(str(tmp_path), "--port", "0", "--model-factory", "tests.serving.helpers:nope")) == 2
    assert "nope" in capsys.readouterr().err


def test_an_unloadable_newest_version_is_skipped_not_fatal(tmp_path):
    """A digest-valid manifest with an unknown model argument: the server starts on the older version."""
    import json
    import signal
    import subprocess
    import sys

    from recstream.data import CategoricalFeature, Schema
    from recstream.models import WideDeep
    from recstream.serving import publish_version
    from recstream.serving.snapshot.layout import manifest_digest

    schema = Schema(["x"], [CategoricalFeature("c", vocab_size=5)])
    for _ in range(2):
        publish_version(tmp_path, WideDeep(schema, hidden=(8,)), model_config={"hidden": [8]})
    path = tmp_path / "v00000002" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["model"]["config"]["wings"] = 2
    doc["manifest_sha256"] = manifest_digest(doc)
    path.write_text(json.dumps(doc))
    proc = subprocess.Popen([sys.executable, "-m", "recstream", "serve", str(tmp_path), "--port", "0",
                             "--log-level", "ERROR"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line and "version 1)" in line, (line, proc.stderr.read())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
