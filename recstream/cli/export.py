"""`recstream export DIR --format F --output PATH`: the newest published model as one file for other servers.

DIR is a publish directory (``ModelPublisher``'s) or a run directory holding one. The newest
usable version is rebuilt as ``recstream serve`` does, exported, checked against the network
on two batch sizes and written to PATH (see `recstream.serving.export.exporter` for the
formats and the input signature). Prints one line naming the file, the version and the
signature. Mistakes -- an unknown format, a DIR without a version, PATH in a missing
directory -- are usage errors (exit status 2); a DIR whose versions are all corrupt, or a
network that cannot be exported, exit 1.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> add_parser(sub).parse_args(["models/", "--format", "onnx", "--output", "m.onnx"]).format
'onnx'
"""
from __future__ import annotations

import argparse
import os

from .errors import EXIT_FAILURE, EXIT_USAGE, CliError

_OWNER = "recstream export"
# = recstream.serving.export.FORMATS (a test checks), not imported: `--help` must not load torch
FORMATS = ("exported-program", "onnx", "torchscript")
DESCRIPTION = """Export the newest published model version as one file for other servers.

Formats: onnx (ONNX Runtime, Triton; needs pip install 'recstream[export]'),
torchscript (LibTorch, Triton's pytorch backend) and exported-program (torch.export,
a .pt2 file). The exported model takes three tensors -- dense float32 [B, n_dense],
values int64 [N] and offsets int64 [F*B+1] (the ids of feature f for example b are
values[offsets[f*B+b]:offsets[f*B+b+1]]) -- and returns float32 [B], logits or
probabilities as the published model does. Any batch size works. Dynamic-id features
take any int64 id: their tables are frozen as published (an id not in a table reads its
default vector). The file is checked against the network before it is written."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``export`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    p = subparsers.add_parser("export", help="export the newest published model (ONNX, TorchScript, torch.export)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", help="publish directory (ModelPublisher's), or a run directory holding one")
    p.add_argument("--format", choices=FORMATS, required=True, help="file format to write")
    p.add_argument("--output", required=True, metavar="PATH",
                   help="file to write (its directory must exist; exported-program needs a .pt2 name)")
    p.add_argument("--model-factory", default=None, metavar="MODULE:FUNCTION",
                   help="function(manifest) -> nn.Module that rebuilds the network (needed for networks "
                        "that are not recstream.models classes)")
    p.set_defaults(run=run)
    return p


def _check_args(args: argparse.Namespace) -> None:
    """The mistakes found without loading anything (usage errors)."""
    if not os.path.isdir(args.directory):
        what = "is not a directory" if os.path.exists(args.directory) else "does not exist"
        raise CliError(f"{args.directory} {what} (export a ModelPublisher's directory)", EXIT_USAGE)
    parent = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(parent):
        raise CliError(f"--output {args.output}: directory {parent} does not exist (create it first)", EXIT_USAGE)
    if os.path.isdir(args.output):
        raise CliError(f"--output {args.output} is a directory; give a file name", EXIT_USAGE)
    if args.format == "exported-program" and not args.output.endswith(".pt2"):
        raise CliError(f"--output {args.output}: an exported-program file must end in .pt2", EXIT_USAGE)


def _describe(sig: dict) -> str:
    inputs = ", ".join(f"{i['name']} {i['dtype']} [{', '.join(map(str, i['shape']))}]" for i in sig["inputs"])
    out = sig["outputs"][0]
    return f"{inputs} -> {out['name']} {out['dtype']} [{', '.join(out['shape'])}]"


def run(args: argparse.Namespace) -> int:
    """Export and print one line; returns the exit status."""
    _check_args(args)
    from ..serving.export import ExportError, export_published  # here: `recstream --help` must not load torch
    from ..serving.snapshot.layout import SnapshotError
    from ..serving.snapshot.model_spec import RebuildError
    try:
        sig = export_published(args.directory, args.output, args.format, model_factory=args.model_factory)
    except FileNotFoundError as e:  # no version at all in DIR (nor in a sub-directory)
        raise CliError(str(e), EXIT_USAGE) from e
    except RebuildError as e:  # the snapshot is fine, a --model-factory is missing
        raise CliError(str(e), EXIT_USAGE) from e
    except (ImportError, AttributeError) as e:  # the ONNX extra is missing, or a bad --model-factory
        raise CliError(str(e), EXIT_USAGE if args.model_factory else EXIT_FAILURE) from e
    except (SnapshotError, ExportError) as e:  # every version corrupt; a network torch.export refuses
        raise CliError(str(e).splitlines()[0], EXIT_FAILURE) from e
    except ValueError as e:  # DIR holds several publish directories
        raise CliError(str(e), EXIT_USAGE) from e
    source = sig["source"]
    print(f"{_OWNER}: wrote {args.output} ({args.format}, version {source['version']} of {source['directory']}): "
          f"{_describe(sig)}", flush=True)
    return 0
