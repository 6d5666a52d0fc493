"""`recstream init [PATH]`: write a commented example config (offline, or ``--online``).

The offline one trains DeepFM on Criteo-format files and evaluates it, the online one trains
Wide&Deep on Criteo-format events arriving in a directory; both are the files of
examples/configs. The printed lines say how to make their data with ``recstream produce``.
An existing PATH is kept unless ``--force``.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> add_parser(sub).parse_args(["--online"]).path
'recstream.yaml'
"""
from __future__ import annotations

import argparse
import os

from .errors import EXIT_USAGE, CliError

DESCRIPTION = """Write a commented example config to PATH (default recstream.yaml).

The default trains DeepFM on Criteo-format TSV files offline; --online trains Wide&Deep
on Criteo-format events arriving in a directory. Every field is documented in docs/cli.md."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("init", help="write a commented example config file", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", default="recstream.yaml", metavar="PATH", help="file to write")
    p.add_argument("--online", action="store_true", help="the online-training example (stream:, prequential)")
    p.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from .templates import OFFLINE, ONLINE
    if os.path.isdir(args.path):
        raise CliError(f"{args.path} is a directory; give a file name", EXIT_USAGE)
    if os.path.exists(args.path) and not args.force:
        raise CliError(f"{args.path} exists; use --force to overwrite it", EXIT_USAGE)
    parent = os.path.dirname(os.path.abspath(args.path))
    if not os.path.isdir(parent):
        raise CliError(f"directory {parent} does not exist (create it first)", EXIT_USAGE)
    text = ONLINE if args.online else OFFLINE
    # The commands in its comments name the file the user asked for, not the example's own name.
    text = text.replace("criteo_online.yaml" if args.online else "criteo_offline.yaml", os.path.basename(args.path))
    with open(args.path, "w", encoding="utf-8") as f:
        f.write(text)
    make = next(line.strip(" #") for line in text.splitlines() if "recstream produce" in line)
    command = "online" if args.online else "train"
    print(f"recstream init: wrote {args.path}; make its data with\n  {make}\nthen run\n  recstream {command} "
          f"{args.path}")
    return 0
