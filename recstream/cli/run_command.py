"""What the run commands ``recstream train | eval | online CONFIG.yaml`` share: the parser, loading
and checking the config (`config_document` reads it, `config_schema` validates it), torch's
settings, and the result line.

The result: one human line on stdout (``recstream train: ...``), or with ``--json`` one JSON
object on stdout instead (the human line then goes to stderr), for scripts::

    {"command": "train", "status": "ok", "run_dir": "runs/x", "metrics": {"auc": 0.71, ...}, ...}

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> add_config_parser(sub, "train", "help", "description", run=None).parse_args(["c.yaml", "--json"]).json
True
"""
from __future__ import annotations

import argparse
import json
import sys

from .errors import CliError


def add_config_parser(sub, name: str, help: str, description: str, run,
                      overwrite: bool | str = False) -> argparse.ArgumentParser:
    """The parser of a run command; `overwrite`: add ``--overwrite`` (a str: its help)."""
    p = sub.add_parser(name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="CONFIG.yaml", help="the run's config file (recstream init writes an example; "
                                                          "reference: docs/cli.md)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line on stdout, for scripts")
    if overwrite:
        p.add_argument("--overwrite", action="store_true", help=overwrite if isinstance(overwrite, str) else
                       "run in a run_dir that already holds a run: its config.yaml is replaced and its metrics start "
                       "again (without it, that is refused)")
    p.set_defaults(run=run, overwrite=False)
    return p


def load_config(path: str):
    """Read and validate a config file: ``(Config, ConfigDocument)``; a mistake is a one-line ConfigError."""
    from pydantic import ValidationError

    from .config_document import ConfigDocument
    from .config_schema import Config
    doc = ConfigDocument.read(path)
    try:
        return Config.model_validate(doc.data or {}), doc
    except ValidationError as e:
        raise doc.validation_error(e) from None


def load(args, *required: tuple):
    """``(Config, ConfigDocument)``; `required`: sections this command needs, e.g. ``("data", "train")``."""
    try:
        import pydantic  # noqa: F401 -- the optional extra: say so before anything else
        import yaml  # noqa: F401
    except ModuleNotFoundError as e:  # the optional extra is not installed
        raise CliError(f"config files need pydantic and PyYAML: pip install 'recstream[cli]' ({e})") from e
    cfg, doc = load_config(args.config)
    for loc in required:
        value = cfg
        for part in loc:
            value = getattr(value, part, None)
        if value is None:
            raise doc.missing(loc, f"recstream {args.command} needs it (see docs/cli.md)")
    return cfg, doc


def setup_torch(cfg) -> None:
    import torch

    from .threads import default_threads
    torch.set_num_threads(cfg.train.threads or default_threads())
    torch.manual_seed(cfg.train.seed)


def emit(args, result: dict, line: str, status: str = "ok") -> int:
    """Print the result (see the module docstring); returns exit status 0. `status`: the JSON's
    ``status`` (``online`` stopped by a signal: ``interrupted`` / ``terminated``)."""
    if args.json:
        print(line, file=sys.stderr, flush=True)
        print(json.dumps({"command": args.command, "status": status, **result}), flush=True)
    else:
        print(line, flush=True)
    return 0


def published(callbacks: list) -> tuple[dict | None, str]:
    """The result's ``published`` entry (``{"directory", "version", "step"}`` of the newest version; None
    without ``publish:``) and its words for the result line."""
    from ..serving import ModelPublisher
    publisher = next((cb for cb in callbacks if isinstance(cb, ModelPublisher)), None)
    if publisher is None:
        return None, ""
    if not publisher.manifests:
        return {"directory": publisher.directory, "version": None, "step": None}, \
            f"; nothing published to {publisher.directory}"
    last = publisher.manifests[-1]
    return ({"directory": publisher.directory, "version": last["version"], "step": last["step"]},
            f"; published version {last['version']} to {publisher.directory}")


def summary(metrics: dict) -> str:
    """``auc=0.7100 logloss=0.5000`` for the numbers of a metrics row."""
    return " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def no_arrow_cancel() -> None:
    """pyarrow cancels a file read on SIGINT with its own handler (``ArrowCancelled``, a failure that
    loses the step, `recstream.data.interrupted`); the readers' reads then finish, and the stop comes
    after the step, at the commands' own signal handling."""
    try:
        import pyarrow
    except ImportError:
        return
    pyarrow.enable_signal_handlers(False)
