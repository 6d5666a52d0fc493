"""argparse ``type`` functions that check values with `recstream.validation`.

A bad value becomes argparse's usage error (exit status 2) naming the option (argparse
prefixes the program name, so the message here leaves out the owner):

>>> parse = checked(int, "recstream demo", "--epochs", minimum=1)
>>> parse("3")
3
>>> parse("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: '--epochs' must be an int >= 1, got 0
"""
from __future__ import annotations

import argparse


def checked(kind: type, owner: str, name: str, **bounds):
    """An argparse ``type`` that parses `kind` (int or float) and checks it against `bounds`."""

    def parse(text: str):
        # imported here: recstream.validation loads torch, which `recstream --help` must not
        from ..validation import check_int, check_number
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{name}' must be {'an int' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            (check_int if kind is int else check_number)(owner, name, value, **bounds)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{owner}: ")) from None
        return value

    parse.__name__ = kind.__name__
    return parse
