"""Online training end to end: events stream in, a model trains on them, serving follows.

1. `recstream produce` writes synthetic click events at --rate into a directory (default) or a
   Kafka topic (with --bootstrap-servers);
2. `RecModel.online_train` trains Wide&Deep on the stream (test-then-train metrics, checkpoints
   with the stream position, a published model version every 5 s);
3. `recstream serve` serves the newest version over HTTP; the example asks it for predictions.
Ctrl-C (or --seconds) stops training cleanly; running the example again resumes from the
checkpoint.

    python examples/online_training.py --seconds 30
    python examples/online_training.py --bootstrap-servers 127.0.0.1:9092 --topic clicks
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

from recstream import RecModel
from recstream.callbacks import Callback, CheckpointConfig, ModelCheckpoint, PrequentialMonitor
from recstream.data import SyntheticCTR
from recstream.models import WideDeep, default_optimizer
from recstream.serving import ModelPublisher
from recstream.testing import free_port

DENSE, CATEGORICAL = 4, 6


class StopAfter(Callback):
    def __init__(self, seconds: float):
        self.seconds, self.began = seconds, None

    def on_train_step_end(self, ctx):
        self.began = self.began or time.monotonic()
        p = ctx.original_args()
        if p.cur_step_num % 50 == 0 and p.get("prequential"):
            q = p.prequential
            print(f"step {p.cur_step_num}: prequential auc={q['auc']:.4f} logloss={q['logloss']:.4f}", flush=True)
        if time.monotonic() - self.began >= self.seconds:
            ctx.request_stop()


def start_producer(args, incoming):
    target = (["--kafka", args.bootstrap_servers, "--topic", args.topic] if args.bootstrap_servers
              else ["--directory", incoming, "--flush-interval", "0.5"])
    cmd = [sys.executable, "-m", "recstream", "produce", "--synthetic", "--num-dense", str(DENSE),
           "--num-categorical", str(CATEGORICAL), "--rate", str(args.rate), "--rows", "100000000", *target]
    return subprocess.Popen(cmd)


def make_stream(args, schema, incoming):
    if args.bootstrap_servers:
        from recstream.data.streams import KafkaStream
        return KafkaStream(args.topic, args.bootstrap_servers, "online-example", schema, batch_size=256,
                           id_column="event_id", time_column="event_time")
    from recstream.data.streams import DirectoryStream
    while not os.path.isdir(incoming):
        time.sleep(0.05)
    return DirectoryStream(incoming, schema, batch_size=256, id_column="event_id", time_column="event_time")


def ask_server(port: int, instances, version: int) -> dict:
    """Predict with the server once it serves `version` (it polls the directory for new ones)."""
    body = json.dumps({"instances": instances}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/predict", body, {"Content-Type": "application/json"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # 503 until a version is loaded
            with urllib.request.urlopen(req, timeout=5) as r:
                answer = json.loads(r.read())
            if answer["version"] >= version:
                return answer
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server did not serve version {version} within 30 s")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "recstream-online"))
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=2000.0, help="events per second produced")
    p.add_argument("--bootstrap-servers", default=None, help="use Kafka instead of a directory")
    p.add_argument("--topic", default="clicks")
    args = p.parse_args(argv)
    incoming, ckpt, models = (os.path.join(args.workdir, d) for d in ("incoming", "ckpt", "models"))
    schema = SyntheticCTR(DENSE, CATEGORICAL).schema
    producer = start_producer(args, incoming)
    port = free_port()
    os.makedirs(models, exist_ok=True)  # serve needs the publish directory to exist (503 until a version)
    server = subprocess.Popen([sys.executable, "-m", "recstream", "serve", models, "--port", str(port),
                               "--poll-seconds", "0.5"])
    try:
        stream = make_stream(args, schema, incoming)
        net = WideDeep(schema, hidden=(64, 32))
        model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net))
        if model.restore(ckpt, stream):
            print("resumed from", ckpt)
        publisher = ModelPublisher(models, schema=schema, model_config={"hidden": [64, 32]}, every_seconds=5)
        every_10s = CheckpointConfig(save_checkpoint_steps=None, save_checkpoint_seconds=10)
        model.online_train(stream, callbacks=[
            StopAfter(args.seconds), PrequentialMonitor(window=20_000, log_every=10_000),
            ModelCheckpoint("online", ckpt, every_10s), publisher], sink_size=1)
        instance = {f.name: 0.5 for f in schema.dense} | {f.name: 3 for f in schema.categorical}
        answer = ask_server(port, [instance], publisher.manifests[-1]["version"])
        print("served version", answer["version"], "score", answer["scores"][0])
        return answer
    finally:
        producer.terminate()
        server.terminate()
        producer.wait(10)
        server.wait(10)


if __name__ == "__main__":
    main()
