"""A poison record (JSON nested ~20,000 levels deep, ~40 KB) is dead-lettered, not fatal.

pyarrow's JSON parser recurses per nesting level: such a record used to kill the reading
process (SIGSEGV), and the restarted trainer died on the same record again. The records are
read in a child process so that a crash shows as its exit status.
"""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
POISON = b'{"label": ' + b"[" * 20000 + b"]" * 20000 + b"}"
GOOD = [json.dumps({"label": i % 2, "x": i * 0.5}).encode() for i in range(10)]

READ_DIRECTORY = """
import sys
from recstream.data import Schema
from recstream.data.streams import DirectoryStream
s = DirectoryStream(sys.argv[1], Schema(["x"]), batch_size=4, format="jsonl", idle_timeout=0.2,
                    dead_letter=sys.argv[2])
print(sum(b.batch_size for b in s), dict(s.bad_records))
"""

READ_KAFKA = """
import sys
from recstream.data import Schema
from recstream.data.streams import KafkaStream
s = KafkaStream(sys.argv[1], sys.argv[2], "g", Schema(["x"]), batch_size=4, format="jsonl", idle_timeout=1,
                assignment=[(sys.argv[1], 0)])
print(sum(b.batch_size for b in s), dict(s.bad_records))
"""


def _run(script, *args):
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    return out.stdout.strip()


def test_a_deeply_nested_json_line_in_a_file_is_dead_lettered(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(b"\n".join(GOOD[:5] + [POISON] + GOOD[5:]) + b"\n")
    assert _run(READ_DIRECTORY, data, tmp_path / "dead.jsonl") == "10 {'malformed': 1}"
    assert "nested deeper than" in (tmp_path / "dead.jsonl").read_text()


def test_a_deeply_nested_json_message_on_kafka_is_dead_lettered(broker, topic):
    name = topic(1)
    broker.produce(name, GOOD[:5] + [POISON] + GOOD[5:], partition=0)
    assert _run(READ_KAFKA, name, broker.bootstrap_servers) == "10 {'malformed': 1}"


# --- float32 overflow (issue 27, item 2): a finite float64 that is inf in float32 -------------
OVERFLOW = [b'{"label": 1, "x": 1e39}', b'{"label": 0, "x": -1e39}']


def _dense(stream):
    import torch
    xs = [b.features.dense for b in stream]
    return torch.cat(xs)[:, 0] if xs else torch.zeros(0)


def test_a_dense_value_beyond_float32_in_a_file_is_dead_lettered(tmp_path):
    from recstream.data import Schema
    from recstream.data.streams import DirectoryStream
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(b"\n".join(GOOD[:5] + OVERFLOW + GOOD[5:]) + b"\n")
    s = DirectoryStream(data, Schema(["x"]), batch_size=4, format="jsonl", idle_timeout=0.2,
                        dead_letter=tmp_path / "dead.jsonl")
    x = _dense(s)
    assert x.isfinite().all() and x.tolist() == [i * 0.5 for i in range(10)]
    assert dict(s.bad_records) == {"non_finite": 2}
    letters = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    first = sum(len(r) + 1 for r in GOOD[:5])  # byte offsets of the two records in the file
    assert [(x["reason"], x["source"]["file"], x["source"]["offset"]) for x in letters] == [
        ("non_finite", "a.jsonl", first), ("non_finite", "a.jsonl", first + len(OVERFLOW[0]) + 1)]
    assert all("1e+39 (dense values must be finite in float32" in x["detail"] for x in letters)


def test_a_dense_value_beyond_float32_on_kafka_is_dead_lettered(broker, topic, tmp_path):
    from recstream.data import Schema
    from recstream.data.streams import KafkaStream
    name = topic(1)
    broker.produce(name, GOOD[:5] + OVERFLOW + GOOD[5:], partition=0)
    s = KafkaStream(name, broker.bootstrap_servers, "g", Schema(["x"]), batch_size=4, format="jsonl",
                    idle_timeout=1, assignment=[(name, 0)], dead_letter=tmp_path / "dead.jsonl")
    with s:
        x = _dense(s)
    assert x.isfinite().all() and x.tolist() == [i * 0.5 for i in range(10)]
    assert dict(s.bad_records) == {"non_finite": 2}
    letters = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert [(x["reason"], x["source"]["topic"], x["source"]["partition"], x["source"]["offset"])
            for x in letters] == [("non_finite", name, 0, 5), ("non_finite", name, 0, 6)]
