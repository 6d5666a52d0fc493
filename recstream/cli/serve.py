"""`recstream serve DIR --port P`: serve the newest model version of a publish directory over HTTP.

Loads the newest usable version of DIR (written by ``ModelPublisher``), answers
``POST /predict`` / ``GET /health`` / ``GET /version`` (see :mod:`recstream.serving.http`) and
hot-swaps newer versions as they are published. Starts even when DIR has no version yet
(``/health`` answers 503 until one appears). Prints one line
``recstream serve: listening on http://HOST:PORT`` once the socket is bound (``--port 0``
picks a free port), stops cleanly on SIGINT/SIGTERM.

Also runnable alone: ``python -m recstream.cli.serve DIR --port 8080``.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> add_parser(sub).parse_args(["models/", "--port", "0"]).poll_seconds
1.0
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

import torch

from ..serving.http import DEFAULT_MAX_BODY_BYTES, make_server
from ..serving.model_holder import ModelHolder
from ..serving.model_spec import RebuildError


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in [0, 65535], got {text}")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``serve`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    p = subparsers.add_parser("serve", help="serve published model versions over HTTP",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("directory", help="publish directory (ModelPublisher's)")
    p.add_argument("--port", type=_port, required=True, help="TCP port (0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--max-body-bytes", type=_positive(int), default=DEFAULT_MAX_BODY_BYTES,
                   help="largest accepted request body; larger ones get 413 (default 1 MiB)")
    p.add_argument("--max-instances", type=_positive(int), default=1024,
                   help="most instances per /predict request (default 1024)")
    p.add_argument("--poll-seconds", type=_positive(float), default=1.0,
                   help="how often to look for new versions (default 1.0)")
    p.add_argument("--model-factory", default=None, metavar="MODULE:FUNCTION",
                   help="function(manifest) -> nn.Module that rebuilds the network (needed for networks "
                        "that are not recstream.models classes)")
    p.add_argument("--torch-threads", type=_positive(int), default=None,
                   help="torch intra-op threads per forward (default: torch's)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; returns the exit status."""
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("recstream.serve")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    try:
        holder = ModelHolder(args.directory, args.model_factory, args.poll_seconds, args.max_instances)
        holder.refresh()
    except (RebuildError, ImportError, AttributeError, ValueError) as e:  # bad --model-factory or spec
        print(f"recstream serve: cannot load models from {args.directory}: {e}", file=sys.stderr)
        return 2
    if holder.current is None:
        log.warning("no usable version in %s yet; /predict answers 503 until one is published", args.directory)
    server = make_server(holder, args.host, args.port, args.max_body_bytes)
    host, port = server.server_address[:2]

    def stop(signum, frame):  # shutdown() waits for serve_forever: call it off the main thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    holder.start()
    version = holder.current.version if holder.current else None
    print(f"recstream serve: listening on http://{host}:{port} (directory {args.directory}, version {version})",
          flush=True)
    try:
        server.serve_forever()
    finally:
        holder.stop()
        server.server_close()
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recstream")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve"] + (sys.argv[1:] if argv is None else list(argv)))
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
