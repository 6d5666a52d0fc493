"""`recstream export DIR --format F --output PATH`: a trained model as one file for other servers.

DIR is a publish directory (``ModelPublisher``'s) or a run directory holding one: the newest
usable version is rebuilt as ``recstream serve`` does. A run directory of ``recstream train``
or ``online`` without published versions (no ``publish:`` section) is exported from its newest
checkpoint (``checkpoints/``, or ``--checkpoint PATH``), the network rebuilt from the run's
``config.yaml`` (or ``--config``) as training built it; the signature records the reader's
preprocessing either way. The network is exported, checked against itself on two batch sizes
and written to PATH (see `recstream.serving.export.exporter` for the formats and the input
signature). Prints one line naming the file, its source and the signature. Mistakes -- an
unknown format, a DIR with neither a version nor a checkpoint and its config, PATH in a missing
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
DESCRIPTION = """Export a trained model as one file for other servers: the newest published
version of DIR (a publish directory or a run directory holding one), or else the newest
checkpoint of a run directory (recstream train/online without publish:), its network rebuilt
from the run's config.yaml; --checkpoint PATH [--config CONFIG.yaml] names another one.

Formats: onnx (ONNX Runtime, Triton; needs pip install 'recstream[export]'),
torchscript (LibTorch, Triton's pytorch backend) and exported-program (torch.export,
a .pt2 file). The exported model takes three tensors -- dense float32 [B, n_dense],
values int64 [N] and offsets int64 [F*B+1] (the ids of feature f for example b are
values[offsets[f*B+b]:offsets[f*B+b+1]]) -- and returns float32 [B], logits or
probabilities as the published model does. Any batch size works. Dynamic-id features
take any int64 id: their tables are frozen as published (an id not in a table reads its
default vector). The file is checked against the network before it is written. Its
signature records the schema and the preprocessing of raw values (read_signature; turn
/predict-style instances into these tensors with
recstream.serving.export.instances_to_inputs)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``export`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    p = subparsers.add_parser("export", help="export a published model or a run's checkpoint (ONNX, TorchScript, "
                              "torch.export)", description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", nargs="?", default=None,
                   help="publish directory (ModelPublisher's), or a run directory (published versions, or else "
                        "checkpoints/ and config.yaml)")
    p.add_argument("--format", choices=FORMATS, required=True, help="file format to write")
    p.add_argument("--output", required=True, metavar="PATH",
                   help="file to write (its directory must exist; exported-program needs a .pt2 name)")
    p.add_argument("--model-factory", default=None, metavar="MODULE:FUNCTION",
                   help="function(manifest) -> nn.Module that rebuilds the network (needed for networks "
                        "that are not recstream.models classes)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="export this checkpoint (a file, or a directory's newest that loads) instead of a "
                        "published version; the network is built from --config")
    p.add_argument("--config", default=None, metavar="CONFIG.yaml",
                   help="the config that trained the checkpoint (default: DIR/config.yaml)")
    p.set_defaults(run=run)
    return p


def _check_args(args: argparse.Namespace) -> None:
    """The mistakes found without loading anything (usage errors)."""
    if args.directory is None and args.checkpoint is None:
        raise CliError("give DIR (a publish or run directory) or --checkpoint PATH --config CONFIG.yaml", EXIT_USAGE)
    if args.checkpoint is not None and args.directory is None and args.config is None:
        raise CliError("--checkpoint needs the config that trained it: --config CONFIG.yaml (or DIR, a run directory "
                       "holding config.yaml)", EXIT_USAGE)
    if args.checkpoint is not None and args.model_factory is not None:
        raise CliError("--model-factory rebuilds published versions; a --checkpoint is rebuilt from --config",
                       EXIT_USAGE)
    if args.directory is not None and not os.path.isdir(args.directory):
        what = "is not a directory" if os.path.exists(args.directory) else "does not exist"
        raise CliError(f"{args.directory} {what} (export a ModelPublisher's directory, or a run directory)",
                       EXIT_USAGE)
    for flag, path in (("--checkpoint", args.checkpoint), ("--config", args.config)):
        if path is not None and not os.path.exists(path):
            raise CliError(f"{flag} {path} does not exist", EXIT_USAGE)
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


def _from_checkpoint(args: argparse.Namespace, checkpoint: str) -> dict:
    """Export `checkpoint` (a file, or a directory's newest that loads), the network built from the
    run's config as ``recstream train`` built it; returns the signature."""
    config = args.config or os.path.join(args.directory, "config.yaml")
    if not os.path.isfile(config):
        raise CliError(f"{checkpoint} holds the checkpoints but {config} does not exist: give the config that "
                       "trained them with --config CONFIG.yaml", EXIT_USAGE)
    from ..checkpoint import CheckpointError
    from ..checkpoint.discovery import load_newest
    from ..serving.export import export_model
    from .build import build_network, build_schema, preprocessing
    from .run_command import load_config
    cfg, doc = load_config(config)
    schema = build_schema(cfg, doc)
    net = build_network(cfg, schema, doc)
    try:
        found = load_newest(checkpoint, net, None)
    except CheckpointError as e:  # corrupt, or from another config's network
        raise CliError(f"{str(e).splitlines()[0]} (is {config} the config that trained it?)", EXIT_FAILURE) from e
    if found is None:
        raise CliError(f"no checkpoint in {checkpoint}", EXIT_USAGE)
    path, meta = found
    online = cfg.stream is not None and cfg.data.train is None  # what `recstream online` read
    source = {"checkpoint": os.path.abspath(path), "config": os.path.abspath(config), "epoch": meta.get("epoch"),
              "step": meta.get("cur_step_num")}
    return export_model(net, schema, args.output, args.format, metadata={"source": source},
                        preprocessing=preprocessing(cfg, online=online))


def _checkpoints_of(directory: str, missing: FileNotFoundError) -> str:
    """The ``checkpoints/`` of a run directory without published versions, or the usage error that
    says what to give instead."""
    checkpoints = os.path.join(directory, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        return checkpoints
    raise CliError(f"{missing}, nor a {checkpoints} to export from: give the run_dir of a recstream train or "
                   "online run (it holds checkpoints/ and config.yaml), --checkpoint PATH --config CONFIG.yaml, or a "
                   "publish directory (a config's publish: section writes one)", EXIT_USAGE) from missing


def _source(sig: dict) -> str:
    source = sig["source"]
    if "version" in source:
        return f"version {source['version']} of {source['directory']}"
    return f"checkpoint {source['checkpoint']}, epoch {source['epoch']}, step {source['step']}"


def run(args: argparse.Namespace) -> int:
    """Export and print one line; returns the exit status."""
    _check_args(args)
    from ..serving.export import ExportError, export_published, find_publish_dir  # here: `--help` must not load torch
    from ..serving.snapshot.layout import SnapshotError
    from ..serving.snapshot.model_spec import RebuildError
    checkpoint = args.checkpoint
    try:
        if checkpoint is None:
            try:
                find_publish_dir(args.directory)
            except FileNotFoundError as e:  # no version at all in DIR (nor in a sub-directory)
                checkpoint = _checkpoints_of(args.directory, e)
        if checkpoint is not None:
            sig = _from_checkpoint(args, checkpoint)
        else:
            sig = export_published(args.directory, args.output, args.format, model_factory=args.model_factory)
    except RebuildError as e:  # the snapshot is fine, a --model-factory is missing
        raise CliError(str(e), EXIT_USAGE) from e
    except (ImportError, AttributeError) as e:  # the ONNX extra is missing, or a bad --model-factory
        raise CliError(str(e), EXIT_USAGE if args.model_factory else EXIT_FAILURE) from e
    except (SnapshotError, ExportError) as e:  # every version corrupt; a network torch.export refuses
        raise CliError(str(e).splitlines()[0], EXIT_FAILURE) from e
    except ValueError as e:  # DIR holds several publish directories
        raise CliError(str(e), EXIT_USAGE) from e
    print(f"{_OWNER}: wrote {args.output} ({args.format}, {_source(sig)}): {_describe(sig)}", flush=True)
    return 0
