"""Running one parsed command: SIGTERM and Ctrl-C as exceptions, and every ending as one line on
stderr with an exit status (see `main.EPILOG`), never a traceback unless ``--debug`` was given.

`main.main` (``recstream COMMAND``) and `serve.main` (``python -m recstream.cli.serve``) both end
here, so that the two share their exit statuses without importing each other.

>>> import argparse
>>> def fails(args):
...     raise CliError("no such file", 2)
>>> dispatch(argparse.Namespace(command="x", debug=False, run=fails))
2
"""
from __future__ import annotations

import signal
import sys

from .errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_TERMINATED, CliError, Interrupted


def _terminate(signum, frame):
    raise Interrupted("terminated", EXIT_TERMINATED)


def dispatch(args) -> int:
    """Run ``args.run(args)``; its exit status, or the one its error or signal stands for."""
    owner = f"recstream {args.command}"
    previous = signal.signal(signal.SIGTERM, _terminate)  # a command may install its own (serve does)
    # Ctrl-C / SIGINT too, explicitly: a process started with SIGINT ignored (a background job of a
    # non-interactive shell) would otherwise never see it, and `produce` would not stop on it.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return args.run(args)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as Interrupted
        print(f"{owner}: {e.args[0] if e.args else 'interrupted'}", file=sys.stderr)
        return getattr(e, "code", EXIT_INTERRUPTED)
    except CliError as e:
        if args.debug:
            raise
        print(f"{owner}: {e.args[0]}", file=sys.stderr)
        return e.code
    except Exception as e:  # noqa: BLE001 -- the last guard: one line instead of a traceback
        if args.debug:
            raise
        print(f"{owner}: error: {type(e).__name__}: {e} (run with --debug for the traceback)", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
