"""`recstream serve DIR --port P`: serve the newest model version of a publish directory over HTTP.

Loads the newest usable version of DIR (written by ``ModelPublisher``), answers
``POST /predict`` / ``GET /health`` / ``GET /version`` / ``GET /schema`` / ``GET /metrics`` (see
`recstream.serving.server.http`; Starlette on uvicorn, ``pip install "recstream[serve]"``) and
hot-swaps newer versions as they are published. Concurrent requests share forward passes
(``--max-batch-rows``, ``--max-batch-wait-ms``); each request has a total deadline
(``--request-timeout``). DIR must exist: a missing DIR (or a file) is
a usage error (exit status 2), since a mistyped path would otherwise answer 503 forever. An
existing DIR without a version yet is served (``/health`` answers 503, with a log line, until
one is published). The port is bound before the model is loaded, so a port in use fails at
once (exit status 1). Prints one line
``recstream serve: listening on http://HOST:PORT`` once the socket is bound (``--port 0``
picks a free port), stops cleanly on SIGINT/SIGTERM.

Also runnable alone: ``python -m recstream.cli.serve DIR --port 8080``.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> add_parser(sub).parse_args(["models/", "--port", "0"]).poll_seconds
0.05
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from .dispatch import dispatch
from .errors import EXIT_USAGE, CliError
from .options import checked

_OWNER = "recstream serve"
# = recstream.serving.server.http.DEFAULT_MAX_BODY_BYTES (a test checks), not imported: `--help` must not load torch
DEFAULT_MAX_BODY_BYTES = 1 << 20
DESCRIPTION = """Serve the newest model version of a publish directory over HTTP.

Answers POST /predict, GET /health, GET /version, GET /schema (the fields a request's
instances hold, their types and an example) and GET /metrics (Prometheus), and
hot-swaps newer versions as ModelPublisher writes them. Concurrent requests are
coalesced into shared forward passes (dynamic micro-batching). DIRECTORY must exist
(a missing one is a usage error); while it holds no version yet, /predict and /health
answer 503. Stops cleanly on Ctrl-C/SIGTERM."""


def _positive(kind, name: str):
    return checked(int, _OWNER, name, minimum=1) if kind is int else checked(kind, _OWNER, name, minimum=0,
                                                                              min_open=True)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``serve`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    p = subparsers.add_parser("serve", help="serve published model versions over HTTP",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", help="publish directory (ModelPublisher's); must exist")
    p.add_argument("--port", type=checked(int, _OWNER, "--port", minimum=0, maximum=65535), required=True,
                   help="TCP port (0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--max-body-bytes", type=_positive(int, "--max-body-bytes"), default=DEFAULT_MAX_BODY_BYTES,
                   help="largest accepted request body; larger ones get 413 (default 1 MiB)")
    p.add_argument("--max-instances", type=_positive(int, "--max-instances"), default=1024,
                   help="most instances per /predict request (default 1024)")
    # a short poll: one listdir and one stat, ~20 per second cost nothing next to serving, and a new
    # version is served within ~0.05 s plus its load (docs/serving.md: why polling, not inotify)
    p.add_argument("--poll-seconds", type=_positive(float, "--poll-seconds"), default=0.05,
                   help="how often to look for new versions (default 0.05)")
    p.add_argument("--model-factory", default=None, metavar="MODULE:FUNCTION",
                   help="function(manifest) -> nn.Module that rebuilds the network (needed for networks "
                        "that are not recstream.models classes)")
    p.add_argument("--max-batch-rows", type=_positive(int, "--max-batch-rows"), default=256,
                   help="most instances per forward pass when requests are coalesced (default 256)")
    p.add_argument("--max-batch-wait-ms", type=checked(float, _OWNER, "--max-batch-wait-ms", minimum=0), default=2.0,
                   help="longest wait for requests still arriving before a forward starts (default 2 ms)")
    p.add_argument("--request-timeout", type=_positive(float, "--request-timeout"), default=30.0,
                   help="total seconds per request: a body not received by then is 408, an answer not ready 503 "
                        "(default 30)")
    p.add_argument("--max-connections", type=_positive(int, "--max-connections"), default=4096,
                   help="open connections served at once; beyond, 503 (default 4096)")
    p.add_argument("--model-name", default="recstream",
                   help="the model's name in the KServe v1 routes /v1/models/NAME[:predict] (default recstream)")
    p.add_argument("--backlog", type=_positive(int, "--backlog"), default=2048,
                   help="listen backlog: connections waiting to be accepted (default 2048)")
    p.add_argument("--torch-threads", type=_positive(int, "--torch-threads"), default=None,
                   help="torch intra-op threads per forward (default: torch's)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; returns the exit status."""
    if not os.path.isdir(args.directory):
        what = "is not a directory" if os.path.exists(args.directory) else "does not exist"
        raise CliError(f"{args.directory} {what} (serve a ModelPublisher's directory; create it first "
                       "to wait for the first version)", EXIT_USAGE)
    import torch  # here, not at the top: `recstream --help` must not load torch

    from ..serving.server.model_holder import ModelHolder
    from ..serving.snapshot.model_spec import RebuildError
    try:
        from ..serving.server.http import make_server
    except ImportError as e:  # the optional HTTP stack is not installed
        raise CliError(f"serving needs its extra: pip install 'recstream[serve]' ({e})") from e

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("recstream.serve")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    try:
        holder = ModelHolder(args.directory, args.model_factory, args.poll_seconds, args.max_instances)
    except (ImportError, AttributeError, ValueError) as e:  # bad --model-factory
        print(f"{_OWNER}: cannot load models from {args.directory}: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:  # bind before loading: a port in use fails at once, not after the model is built
        server = make_server(holder, args.host, args.port, args.max_body_bytes, max_batch_rows=args.max_batch_rows,
                             max_batch_wait=args.max_batch_wait_ms / 1000, request_timeout=args.request_timeout,
                             max_connections=args.max_connections, backlog=args.backlog,
                             model_name=args.model_name)
    except OSError as e:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    try:
        holder.refresh()
    except (RebuildError, ImportError, AttributeError, ValueError) as e:  # bad --model-factory or spec
        server.server_close()
        print(f"{_OWNER}: cannot load models from {args.directory}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if holder.current is None:
        log.warning("no usable version in %s yet; /predict answers 503 until one is published", args.directory)
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
    """``python -m recstream.cli.serve DIR ...``: `recstream serve` alone, with the same error handling
    and exit statuses (`dispatch`)."""
    parser = argparse.ArgumentParser(prog="recstream")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return dispatch(parser.parse_args(["serve"] + (sys.argv[1:] if argv is None else list(argv))))


if __name__ == "__main__":
    raise SystemExit(main())
