"""`recstream` command line.

- `recstream demo`: train and evaluate a small CTR model end to end (the embedded default job);
- `recstream serve DIR --port P`: serve the newest published model over HTTP, hot-swapping versions;
- `recstream produce ...`: write a file or synthetic events into Kafka or a directory;
- `recstream export DIR --format F --output PATH`: the newest published model as ONNX, TorchScript or .pt2;
- `recstream init [PATH]`, `recstream train|eval|online CONFIG.yaml`: config-driven runs (docs/cli.md);
- `recstream plot RUN_DIR`: PNG plots of a run's metrics.

The command modules import torch (and the rest of the library) only inside their ``run``,
so that ``--help`` and ``--version`` answer at once. A mistake ends with one line on stderr
and an exit status (see ``EPILOG``), never a traceback unless ``--debug`` is given
(`dispatch`).

>>> build_parser().parse_args(["demo", "--epochs", "2"]).epochs
2
"""
from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import demo, eval_cmd, export, init_cmd, online_cmd, plot_cmd, produce, serve, train_cmd
from .dispatch import dispatch

EPILOG = """exit status:
  0    success
  1    runtime failure (port in use, broker unreachable, bad data, ...)
  2    usage error (unknown option, bad value, missing input file or directory)
  130  interrupted (Ctrl-C / SIGINT)
  143  terminated (SIGTERM)

Errors are reported as one line on stderr; add --debug for the Python traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recstream", description="Train recommendation models fast on PyTorch.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"recstream {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_parser(sub)
    init_cmd.add_parser(sub)
    train_cmd.add_parser(sub)
    eval_cmd.add_parser(sub)
    online_cmd.add_parser(sub)
    serve.add_parser(sub)
    produce.add_parser(sub)
    export.add_parser(sub)
    plot_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)  # usage errors: exit 2
    return dispatch(args)


if __name__ == "__main__":
    raise SystemExit(main())
