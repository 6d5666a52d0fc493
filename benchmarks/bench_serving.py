"""Serving load test: requests/s and p50/p99 latency of `recstream serve` while versions are published.

Not a pytest test. Starts ``recstream serve`` as a subprocess on loopback with a small
Wide&Deep, publishes a new version every ``--publish-every`` seconds from this process during
the whole run (so hot swaps happen under load), and drives one-instance ``POST /predict``
requests over ``C`` concurrent keep-alive connections for each ``C`` in ``--connections``
(an asyncio client: one coroutine per connection, each sending its next request when the
previous answer arrived). A failed request is any non-200 answer, a transport error or no
answer within 30 s; the bar is 0 at every level. Prints a Markdown table.

    python benchmarks/bench_serving.py --seconds 5
    python benchmarks/bench_serving.py --connections 1 16 --seconds 2 --publish-every 0.5

The client runs on the same machine as the server: on a small machine it competes with the
server for the cores, so the figures are a lower bound of what the server alone sustains.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from recstream.data import CategoricalFeature, Schema
from recstream.models import WideDeep
from recstream.serving import SnapshotWriter

REPO = Path(__file__).resolve().parents[1]
SCHEMA = Schema([f"d{i}" for i in range(4)], [CategoricalFeature(f"c{i}", vocab_size=1000, embedding_dim=8)
                                              for i in range(6)])
CONFIG = {"hidden": [64, 32]}
TIMEOUT_S = 30.0


def instance(rng: np.random.Generator) -> dict:
    inst = {f"d{i}": float(rng.standard_normal()) for i in range(4)}
    inst.update({f"c{i}": int(rng.integers(0, 1000)) for i in range(6)})
    return inst


class Publisher(threading.Thread):
    """Publishes a perturbed copy of the network every `every` seconds until stopped."""

    def __init__(self, directory: str, every: float):
        super().__init__(daemon=True)
        torch.manual_seed(0)
        self.net = WideDeep(SCHEMA, hidden=tuple(CONFIG["hidden"]))
        self.writer = SnapshotWriter(directory, SCHEMA, model_config=CONFIG, keep=3)
        self.every, self.stop, self.published = every, threading.Event(), 0

    def publish(self) -> None:
        with torch.no_grad():
            for p in self.net.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        self.writer.publish(self.net, step=self.published)
        self.published += 1

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.publish()


def start_server(directory: str, args) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "recstream.cli.serve", directory, "--port", "0", "--poll-seconds", "0.2",
           "--torch-threads", "1", "--log-level", "WARNING", "--max-batch-wait-ms", str(args.max_batch_wait_ms)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    line = lines.get(timeout=120)
    if "listening on http://" not in line:
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, int(line.split("http://127.0.0.1:")[1].split()[0])


async def connection(port: int, body: bytes, until: float, warm_until: float, out: dict) -> None:
    head = (f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    request = head + body
    reader = writer = None
    while time.perf_counter() < until:
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT_S)
            start = time.perf_counter()
            writer.write(request)
            status, payload = await asyncio.wait_for(read_response(reader), TIMEOUT_S)
            end = time.perf_counter()
            if status != 200:
                out["failed"] += 1
                out["errors"].append(f"{status}: {payload[:200]!r}")
                continue
            if start >= warm_until:
                out["latencies"].append(end - start)
                out["versions"].add(json.loads(payload)["version"])
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            out["failed"] += 1
            out["errors"].append(repr(e))
            if writer is not None:
                writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next(int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.strip().lower() == "content-length")
    return status, await reader.readexactly(length)


async def level(port: int, conns: int, seconds: float, warmup: float) -> dict:
    rng = np.random.default_rng(conns)
    bodies = [json.dumps({"instances": [instance(rng)]}).encode() for _ in range(conns)]
    out = {"latencies": [], "failed": 0, "errors": [], "versions": set()}
    t0 = time.perf_counter()
    warm_until, until = t0 + warmup, t0 + warmup + seconds
    await asyncio.gather(*(connection(port, b, until, warm_until, out) for b in bodies))
    lat = np.array(out["latencies"]) * 1000
    measured = min(time.perf_counter(), until) - warm_until
    return {"connections": conns, "rps": lat.size / measured, "p50": float(np.percentile(lat, 50)) if lat.size else
            float("nan"), "p99": float(np.percentile(lat, 99)) if lat.size else float("nan"),
            "ok": int(lat.size), "failed": out["failed"], "versions": len(out["versions"]), "errors": out["errors"][:3]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, nargs="+", default=[1, 16, 128, 512])
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per level")
    p.add_argument("--publish-every", type=float, default=1.0, help="seconds between published versions")
    p.add_argument("--max-batch-wait-ms", type=float, default=2.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as directory:
        publisher = Publisher(directory, args.publish_every)
        publisher.publish()
        proc, port = start_server(directory, args)
        rows = []
        try:
            time.sleep(1.0)  # the first version loads
            publisher.start()
            for conns in args.connections:
                rows.append(level_sync(port, conns, args))
        finally:
            publisher.stop.set()
            proc.terminate()
            proc.wait(timeout=60)
    print(f"\n{publisher.published} versions published during the run (one every {args.publish_every:g} s)\n")
    print("| connections | requests/s | p50 ms | p99 ms | requests | failed | versions served |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['connections']} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['ok']} | {r['failed']} "
              f"| {r['versions']} |")
    for r in rows:
        if r["errors"]:
            print(f"errors at {r['connections']} connections (first 3): {r['errors']}")


def level_sync(port: int, conns: int, args) -> dict:
    try:
        import uvloop
        return uvloop.run(level(port, conns, args.seconds, args.warmup))
    except ImportError:
        return asyncio.run(level(port, conns, args.seconds, args.warmup))


if __name__ == "__main__":
    main()
