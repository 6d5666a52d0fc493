"""`recstream serve` argument handling (the running server is tested in test_hot_swap.py)."""
import argparse

import pytest

from recstream.cli import serve
from recstream.serving import SnapshotWriter

from .helpers import CONFIG, SCHEMA, new_model


def parse(*argv):
    parser = argparse.ArgumentParser(prog="recstream")
    serve.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def test_defaults_and_options():
    args = parse("models", "--port", "8080")
    assert (args.directory, args.port, args.host, args.max_body_bytes, args.poll_seconds) == (
        "models", 8080, "127.0.0.1", 1 << 20, 1.0)
    assert args.run is serve.run
    args = parse("m", "--port", "0", "--host", "0.0.0.0", "--max-body-bytes", "100", "--poll-seconds", "0.5",
                 "--model-factory", "pkg.mod:fn", "--max-instances", "7")
    assert (args.host, args.max_body_bytes, args.poll_seconds, args.model_factory, args.max_instances) == (
        "0.0.0.0", 100, 0.5, "pkg.mod:fn", 7)


@pytest.mark.parametrize("argv", [["m"], ["m", "--port", "70000"], ["m", "--port", "1", "--max-body-bytes", "0"],
                                  ["m", "--port", "1", "--poll-seconds", "-1"]])
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
