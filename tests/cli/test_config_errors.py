"""Config-file mistakes: `recstream train CONFIG.yaml` in a subprocess, each mistake one line on
stderr naming the field, the value, what is allowed and file:line, exit status 2, no traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from recstream.cli import config_schema as config
from recstream.cli.errors import EXIT_USAGE

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

BASE = """run_dir: runs/r
schema:
  criteo:
    hash_buckets: 100
    embedding_dim: 4
data:
  train:
    format: criteo
    path: day_0.tsv
    batch_size: 8
model:
  type: deepfm
  hidden: [8]
train:
  epochs: 1
  threads: 1
"""


def run_cli(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recstream", *argv], capture_output=True, text=True, timeout=120,
                          env=ENV, cwd=tmp_path)


def write(tmp_path, text: str) -> str:
    (tmp_path / "day_0.tsv").write_text("\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26) + "\n")
    (tmp_path / "c.yaml").write_text(text)
    return "c.yaml"


def line_of(text: str, needle: str) -> int:
    """The first line holding `needle` (``^name``: the first line starting with it)."""
    start = needle.startswith("^")
    return next(i for i, line in enumerate(text.splitlines(), 1)
                if (line.startswith(needle[1:]) if start else needle in line))


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == EXIT_USAGE, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# (replace this, with that, the line to point at, the words the message must hold)
CASES = {
    "unknown key": ("  hidden: [8]\n", "  hidden: [8]\n  hiden: [16]\n", "hiden:",
                    ["model.hiden", "unknown key", "[16]", "allowed keys:", "hidden", "embedding_dim",
                     "; did you mean 'hidden'?"]),
    "wrong type": ("  epochs: 1\n", "  epochs: two\n", "epochs: two",
                   ["train.epochs", "got 'two'", "must be a valid integer"]),
    "bad value": ("  epochs: 1\n", "  epochs: 1\n  amp_level: O4\n", "amp_level",
                  ["train.amp_level", "got 'O4'", "'O0', 'O1', 'O2', 'O3' or 'auto'"]),
    "number out of range": ("    batch_size: 8\n", "    batch_size: 0\n", "batch_size",
                            ["data.train.batch_size", "got 0", "greater than 0"]),
    "list item": ("  hidden: [8]\n", "  hidden: [8, -4]\n", "hidden",
                  ["model.hidden[1]", "got -4", "greater than 0"]),
    "model type": ("  type: deepfm\n", "  type: xgboost\n", "type: xgboost",
                   ["model.type", "got 'xgboost'", "'widedeep', 'deepfm', 'dcnv2', 'dlrm'"]),
    "missing file": ("    path: day_0.tsv\n", "    path: day_9.tsv\n", "day_9",
                     ["data.train.path", "got 'day_9.tsv'", "no such file or directory"]),
    "missing key": ("  type: deepfm\n", "", "model:", ["model.type", "required key is missing", "'widedeep'"]),
    "duplicate key": ("  epochs: 1\n", "  epochs: 1\n  epochs: 2\n", "epochs: 2", ["train.epochs", "twice"]),
    "yaml syntax": ("  hidden: [8]\n", "  hidden: [8\n", "^train:", ["not valid YAML"]),
    "schema source": ("    embedding_dim: 4\n", "    embedding_dim: 4\n  dense: [x]\n", "schema:",
                      ["schema", "exactly one of criteo:, file: or dense:/categorical:", "got {"]),
    "reader format": ("    format: criteo\n", "    format: xml\n", "format: xml",
                      ["data.train.format", "got 'xml'", "'criteo', 'csv', 'tsv' or 'parquet'"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_mistake_is_one_line_with_field_value_allowed_and_line(case, tmp_path):
    old, new, at, words = CASES[case]
    assert old in BASE
    text = BASE.replace(old, new, 1)
    result = run_cli(tmp_path, "train", write(tmp_path, text))
    message = one_line_error(result)
    assert message.startswith(f"recstream train: c.yaml:{line_of(text, at)}: "), message
    for word in words:
        assert word in message, (word, message)
    assert not (tmp_path / "runs").exists()  # nothing written for a config that does not validate


def test_an_unknown_key_close_to_an_allowed_one_gets_a_did_you_mean(tmp_path, monkeypatch):
    from recstream.cli.config_document import ConfigError
    from recstream.cli.run_command import load_config
    monkeypatch.chdir(tmp_path)  # the config's relative data path
    for typo, value, suggestion in (("epoch", "3", "; did you mean 'epochs'?"), ("colour", "3", "")):
        text = BASE.replace("  epochs: 1\n", f"  {typo}: {value}\n")
        write(tmp_path, text)
        with pytest.raises(ConfigError) as e:
            load_config("c.yaml")
        message = str(e.value)
        assert message.startswith(f"c.yaml:{line_of(text, typo)}: train.{typo}: unknown key "
                                  f"(value 3); allowed keys: epochs, "), message
        assert message.endswith(suggestion) and message.count("did you mean") == (1 if suggestion else 0), message


def test_library_refusal_is_reported_at_the_section(tmp_path):
    """A value pydantic accepts but the library refuses (two id spaces for one column) is still a
    config mistake, reported at its section."""
    text = BASE.replace("  criteo:\n    hash_buckets: 100\n    embedding_dim: 4\n",
                        "  dense: [x]\n  categorical:\n    - name: c\n      vocab_size: 5\n      hash_buckets: 9\n")
    text = text.replace("format: criteo", "format: csv")
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, text)))
    assert message.startswith(f"recstream train: c.yaml:{line_of(text, '- name: c')}: schema.categorical[0]: "
                              "got 'c'; CategoricalFeature('c')"), message
    assert "vocab_size" in message and "hash_buckets" in message


def test_a_command_names_the_section_it_needs(tmp_path):
    for command, text, section in (("eval", BASE, "data.eval"), ("online", BASE, "stream"),
                                   ("train", BASE.split("data:")[0] + "model:\n  type: dlrm\n", "data.train")):
        message = one_line_error(run_cli(tmp_path, command, write(tmp_path, text)))
        assert f"{section}: required key is missing; recstream {command} needs it" in message, message


def test_missing_config_file_and_missing_checkpoint(tmp_path):
    message = one_line_error(run_cli(tmp_path, "train", "nope.yaml"))
    assert message == "recstream train: nope.yaml: config file does not exist"
    text = BASE.replace("data:\n", "data:\n  eval:\n    format: criteo\n    path: day_0.tsv\n")
    message = one_line_error(run_cli(tmp_path, "eval", write(tmp_path, text)))
    assert "no checkpoint: runs/r/checkpoints does not exist" in message, message


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli(tmp_path, "--debug", "train", write(tmp_path, BASE.replace("epochs: 1", "epochs: two")))
    assert result.returncode != 0 and "Traceback" in result.stderr and "ConfigError" in result.stderr


def test_levels_match_the_library():
    from recstream.models.dcn_v2 import STRUCTURES
    from recstream.models.recommended_optimizer import EMBEDDING_OPTIMIZERS, WIDE_OPTIMIZERS
    from recstream.train.amp import AMP_LEVELS
    from recstream.train.model import BOOST_LEVELS
    assert config.AMP_LEVELS == AMP_LEVELS and config.BOOST_LEVELS == BOOST_LEVELS
    fields = config.OptimizerSection.model_fields
    assert fields["embedding"].annotation.__args__ == EMBEDDING_OPTIMIZERS
    assert fields["wide"].annotation.__args__ == WIDE_OPTIMIZERS
    assert config.DCNv2Args.model_fields["structure"].annotation.__args__ == STRUCTURES


def test_the_optimizer_section_has_every_default_optimizer_keyword():
    import inspect

    from recstream.models import default_optimizer
    keywords = [n for n, p in inspect.signature(default_optimizer).parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert sorted(config.OptimizerSection.model_fields) == sorted(keywords)


# --- hostile documents: linear to read, refused as config mistakes ----------------------------
def alias_bomb(levels: int) -> str:
    """9 aliases of 9 aliases of ...: 9**levels values once expanded, a few hundred bytes written."""
    text = 'l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n'
    for i in range(1, levels + 1):
        text += f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n"
    return text


def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path):
    """9**12 values once expanded: reading it took minutes (the duplicate-key check followed every
    alias; 9**9 took over 60 s); now one pass over the text names the alias that crosses the bound."""
    text = alias_bomb(12) + BASE
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, text)))
    assert message.startswith(f"recstream train: c.yaml:{line_of(text, '^l6:')}: aliases expand the document by "
                              "more than 1,000,000 values"), message


def test_aliases_that_stay_small_are_read_as_before(tmp_path):
    text = "hidden: &h [8]\n" + BASE.replace("  hidden: [8]\n", "  hidden: *h\n")
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, text)))
    assert "c.yaml:1: hidden: unknown key (value [8])" in message, message  # the document read fully


def test_a_document_nested_too_deep_is_a_config_mistake(tmp_path):
    """900 levels: YAML's composer recursed into RecursionError (exit 1)."""
    text = BASE + "eval:\n  checkpoint: " + "[" * 900 + "]" * 900 + "\n"
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, text)))
    assert message == f"recstream train: c.yaml:{line_of(text, 'checkpoint')}: nested more than 50 levels deep; " \
                      "a config needs far fewer", message


@pytest.mark.parametrize("old, new, words", [
    ("  epochs: 1\n", "  epochs: 1\n  seed: 18446744073709551616\n",  # 2**64: torch's ValueError, exit 1
     ["train.seed", "got 18446744073709551616", "less than or equal to 18446744073709551615"]),
    ("  epochs: 1\n", "  epochs: 1\n  seed: -1\n", ["train.seed", "got -1", "greater than or equal to 0"]),
    ("  threads: 1\n", "  threads: 1\noptimizer:\n  lr: .inf\n", ["optimizer.lr", "got inf", "finite number"]),
    ("  threads: 1\n", "  threads: 1\noptimizer:\n  weight_decay: .nan\n", ["optimizer.weight_decay", "finite"]),
])
def test_numbers_out_of_range_name_the_field_and_the_bound(tmp_path, old, new, words):
    text = BASE.replace(old, new, 1)
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, text)))
    assert message.startswith(f"recstream train: c.yaml:{line_of(text, words[0].split('.')[-1] + ':')}: "), message
    for word in words:
        assert word in message, (word, message)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value, words", [
    (r'"runs/a\0b"', ["run_dir", r"got 'runs/a\x00b'", r"a path cannot hold a NUL character (\0)"]),
    (r'"runs/\ud800"', ["run_dir", r"got 'runs/\ud800'", "text must be valid Unicode (no lone surrogates"]),
    (r'"runs/\udc80"', ["run_dir", r"got 'runs/\udc80'", "text must be valid Unicode"]),
])
def test_a_path_that_cannot_name_a_file_is_a_config_mistake(tmp_path, value, words):
    """A NUL or a lone surrogate in run_dir ended in ValueError / FileNotFoundError / UnicodeEncodeError
    (exit 1) once the run directory was made."""
    text = BASE.replace("run_dir: runs/r\n", f"run_dir: {value}\n")
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, text)))
    assert message.startswith("recstream train: c.yaml:1: "), message
    for word in words:
        assert word in message, (word, message)
    assert sorted(os.listdir(tmp_path)) == ["c.yaml", "day_0.tsv"]  # no run directory made


def test_a_lone_surrogate_anywhere_is_a_config_mistake(tmp_path):
    text = BASE.replace("  type: deepfm\n", '  type: deepfm\n  activation: "rel\\udfffu"\n')
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, text)))
    assert message.startswith(f"recstream train: c.yaml:{line_of(text, 'activation')}: model.activation: "), message
    assert "text must be valid Unicode" in message


CATEGORICAL = BASE.replace("  criteo:\n    hash_buckets: 100\n    embedding_dim: 4\n",
                           "  dense: [x]\n  categorical:\n    - {name: c, vocab_size: 5}\n").replace("format: criteo",
                                                                                             "format: csv")


@pytest.mark.parametrize("old, new, at, words", [
    ("vocab_size: 5", "vocab_size: 1000000000000", "vocab_size",
     ["schema.categorical[0].vocab_size", "got 1000000000000", "less than or equal to 2147483647"]),
    ("vocab_size: 5", "vocab_size: 5, embedding_dim: 1000000000", "vocab_size",
     ["schema.categorical[0].embedding_dim", "got 1000000000", "less than or equal to 4096"]),
    ("  hidden: [8]\n", "  hidden: [1000000, 1000000]\n", "hidden",
     ["model.hidden[0]", "got 1000000", "less than or equal to 65536"]),
    ("  hidden: [8]\n", "  hidden: [8]\n  embedding_dim: 1000000000\n", "embedding_dim",
     ["model.embedding_dim", "got 1000000000", "less than or equal to 4096"]),
    ("  hidden: [8]\n", "  hidden: [" + ", ".join(["8"] * 65) + "]\n", "hidden",
     ["model.hidden", "at most 64 items"]),
    # within each bound, but larger than any machine: refused before anything is allocated
    ("vocab_size: 5", "vocab_size: 2000000000, embedding_dim: 4096", "vocab_size",
     ["schema.categorical[0]: got 2000000000", "the table of 'c' (2,000,000,000 rows x 4096 float32) needs "
      "30,517.6 GiB; this machine has"]),
    ("  hidden: [8]\n", "  hidden: [" + ", ".join(["65536"] * 64) + "]\n", "hidden",
     ["model.hidden: got [65536, 65536,", "these layers' weights need 1,008.0 GiB; this machine has"]),
])
def test_sizes_beyond_their_bounds_name_the_field_and_the_bound(tmp_path, old, new, at, words):
    """vocab_size 10**12, hidden [1e6, 1e6], embedding_dim 1e9 ended in the allocator's error (no field)."""
    (tmp_path / "day_0.csv").write_text("label,x,c\n1,0.5,3\n")
    text = CATEGORICAL.replace(old, new, 1).replace("path: day_0.tsv", "path: day_0.csv")
    (tmp_path / "c.yaml").write_text(text)
    message = one_line_error(run_cli(tmp_path, "train", "c.yaml"))
    assert message.startswith(f"recstream train: c.yaml:{line_of(text, at)}: "), message
    for word in words:
        assert word in message, (word, message)


# --- an earlier run in run_dir ---------------------------------------------------------------
def test_train_refuses_a_run_dir_holding_an_earlier_run_unless_overwrite(tmp_path):
    """A second `recstream train` into the same run_dir replaced its config.yaml and started its metrics
    again, silently."""
    first = run_cli(tmp_path, "train", write(tmp_path, BASE))
    assert first.returncode == 0, first.stderr
    run = tmp_path / "runs" / "r"
    before = {name: (run / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}
    changed = BASE.replace("  epochs: 1\n", "  epochs: 2\n")
    message = one_line_error(run_cli(tmp_path, "train", write(tmp_path, changed)))
    assert message.startswith("recstream train: c.yaml:1: run_dir: got 'runs/r'; it holds an earlier run "
                              "(metrics.jsonl, checkpoints/, config.yaml of another config): give --resume to "
                              "continue it from its newest checkpoint, --new to start again (the earlier run's files "
                              "move into runs/r/earlier-TIME/), or a new run_dir"), message
    assert {name: (run / name).read_bytes() for name in before} == before
    again = run_cli(tmp_path, "train", "c.yaml", "--overwrite")
    assert again.returncode == 0, again.stderr
    assert (run / "config.yaml").read_text() == changed
    assert [json.loads(r)["epoch"] for r in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_online_refuses_a_run_dir_without_checkpoints_that_holds_an_earlier_run(tmp_path):
    (tmp_path / "events").mkdir()
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.5}\n')
    text = BASE + "stream:\n  directory: {path: events}\n  idle_timeout: 0.1\n"
    message = one_line_error(run_cli(tmp_path, "online", write(tmp_path, text)))
    assert message.startswith("recstream online: c.yaml:1: run_dir: got 'runs/r'; it holds an earlier run "
                              "(metrics.jsonl); recstream online resumes only from checkpoints"), message
    assert (run / "metrics.jsonl").read_text() == '{"epoch": 1, "loss": 0.5}\n' and not (run / "config.yaml").exists()


BAD_ROWS = """run_dir: run
schema:
  dense: [x]
  categorical:
    - {name: c, vocab_size: 10, embedding_dim: 4}
data:
  train: {format: csv, path: train.csv, batch_size: 2}
  eval: {format: csv, path: eval.csv, batch_size: 2}
model:
  type: widedeep
  hidden: [4]
train:
  threads: 1
"""


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_bad_row_names_the_config_key_that_skips_it(split, tmp_path, monkeypatch, capsys):
    from recstream.cli.main import main
    monkeypatch.chdir(tmp_path)
    good, bad = "label,x,c\n1,0.5,1\n0,0.1,2\n", "label,x,c\n1,0.5,1\n0,abc,2\n"
    (tmp_path / "train.csv").write_text(bad if split == "train" else good)
    (tmp_path / "eval.csv").write_text(bad if split == "eval" else good)
    (tmp_path / "c.yaml").write_text(BAD_ROWS)
    assert main(["train", "c.yaml"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{split}.csv: row 2: column 'x': cannot parse 'abc' as a number (reason: unparsable); set " \
           f"data.{split}.on_bad_row: skip in c.yaml to skip and count such rows" in line, line
    assert "on_bad_row='skip'" not in line  # the Python keyword means nothing to a config's author
