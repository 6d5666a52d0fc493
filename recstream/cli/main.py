"""`recstream` command line.

- `recstream demo`: train and evaluate a small CTR model end to end (the embedded default job);
- `recstream serve DIR --port P`: serve the newest published model over HTTP, hot-swapping versions;
- `recstream produce ...`: write a file or synthetic events into Kafka or a directory.
"""
from __future__ import annotations

import argparse
import sys

from . import demo, produce, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recstream", description="Train recommendation models fast on PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub)
    serve.add_parser(sub)
    produce.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
