"""`recstream` command line. `recstream demo` trains a small model end to end and evaluates it."""
from __future__ import annotations

import argparse
import sys

from . import demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recstream", description="Train recommendation models fast on PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
