"""Exit statuses of the command line and the exceptions that carry them.

>>> CliError("no such file", EXIT_USAGE).code
2
>>> isinstance(Interrupted("terminated", EXIT_TERMINATED), KeyboardInterrupt)
True
"""
from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class CliError(Exception):
    """A mistake or failure to report as one line (the message) and an exit status (code)."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


class Interrupted(KeyboardInterrupt):
    """SIGTERM turned into an exception, so ``finally`` blocks run (files closed, servers stopped).

    A KeyboardInterrupt so that library code which catches ``Exception`` does not swallow it.
    """

    def __init__(self, message: str = "interrupted", code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message)
        self.code = code
