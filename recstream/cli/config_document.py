"""The config document: a YAML config file read so that every mistake names its place: field path,
value, what is allowed, and ``file:line``.

The file is parsed twice from the same text: ``yaml.safe_load`` gives the plain data that
pydantic validates, ``yaml.compose`` the node tree whose ``start_mark`` says where each key
and value is written. A pydantic error location (``("model", "hidden", 1)``) is walked down
that tree to the deepest node it names; location parts that are not in the file (the tag of
a discriminated union, the name of a missing key) are stepped over.

Reading is linear in the document: YAML aliases share one node, and no walk here expands them
(`_check_nodes` visits each node once); a document whose aliases would add more than
`MAX_VALUES` values (an "alias bomb": 9 aliases of 9 aliases of ... grows 9x per level) is refused
at the alias that crosses the bound, before anything expands it.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "c.yaml")
>>> _ = open(path, "w").write("model:\\n  type: deepfm\\n  hidden: [64, x]\\n")
>>> doc = ConfigDocument.read(path)
>>> doc.data["model"]["hidden"], doc.line(("model", "hidden", 1))
([64, 'x'], 3)
>>> doc.error(("model", "hidden", 1), "x", "must be an int").args[0].endswith("c.yaml:3: model.hidden[1]: "
...                                                                          "got 'x'; must be an int")
True
"""
from __future__ import annotations

import difflib
import os
import reprlib
from dataclasses import dataclass
from typing import Any

from .errors import EXIT_USAGE, CliError

NOT_GIVEN = object()
MAX_VALUES = 1_000_000  # values that aliases may add to a document, expanded
MAX_DEPTH = 50  # collections inside collections: a config needs 6; the composer recurses per level


class ConfigError(CliError):
    """A mistake in a config file (exit status 2); the message is one line starting ``file:line:``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


def dotted(loc: tuple) -> str:
    """``("model", "hidden", 1)`` -> ``"model.hidden[1]"``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def show(value: Any, limit: int = 60) -> str:
    """A value as written in the message: repr, shortened (the repr itself bounded: a value may be
    deep or shared many times over by aliases)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 4, 200, 200, 200
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 12


def did_you_mean(ctx: dict) -> str:
    """``"; did you mean 'epochs'?"`` for an unknown key close to an allowed one (a typo), else ``""``.

    >>> did_you_mean({"key": "epoch", "allowed": "epochs, seed, threads"})
    "; did you mean 'epochs'?"
    >>> did_you_mean({"key": "colour", "allowed": "epochs, seed"})
    ''
    """
    allowed = [a for a in str(ctx.get("allowed", "")).split(", ") if a]
    close = difflib.get_close_matches(str(ctx.get("key")), allowed, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_expansion(path: str, events) -> None:
    """Refuse a document whose aliases add more than MAX_VALUES values when expanded, at the alias that
    crosses the bound, or nested more than MAX_DEPTH deep (composing it would exhaust Python's stack);
    one pass over the parser's events (the parser keeps a stack of states, it does not recurse)."""
    import yaml
    sizes: dict[str, int] = {}  # anchor -> values under it, expanded
    # values so far (expanded), those added by aliases, and (anchor, total before it) of each open collection
    total, by_aliases, open_ = 0, 0, []
    for event in events:
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            open_.append((event.anchor, total))
            total += 1
            if len(open_) > MAX_DEPTH:
                raise ConfigError(f"{path}:{event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep; "
                                  "a config needs far fewer")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, before = open_.pop()
            if anchor is not None:
                sizes[anchor] = total - before
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            size = sizes.get(event.anchor, 1)  # an unknown anchor: the composer names it
            total, by_aliases = total + size, by_aliases + size
            if by_aliases > MAX_VALUES:
                raise ConfigError(f"{path}:{event.start_mark.line + 1}: aliases expand the document by more than "
                                  f"{MAX_VALUES:,} values; a config needs far fewer (an alias bomb?)")


@dataclass
class ConfigDocument:
    """A config file's text, its data and its node tree (see the module docstring)."""

    path: str
    data: Any
    root: Any  # yaml.Node, or None for an empty file

    @classmethod
    def read(cls, path: str) -> ConfigDocument:
        """Parse `path`; a missing file or a YAML syntax error is a ConfigError."""
        import yaml  # here: `recstream --help` must stay fast
        if not os.path.isfile(path):
            what = "is a directory, not a config file" if os.path.isdir(path) else "does not exist"
            raise ConfigError(f"{path}: config file {what}")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            _check_expansion(path, yaml.parse(text, Loader=yaml.SafeLoader))
            loader = yaml.SafeLoader(text)
            try:  # one parse: the data is constructed from the node tree (aliases stay shared)
                root = loader.get_single_node()
                data = loader.construct_document(root) if root is not None else None
            finally:
                loader.dispose()
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else path
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{where}: not valid YAML: {problem}") from e
        doc = cls(path, data, root)
        doc._check_nodes(root, (), set())
        if data is not None and not isinstance(data, dict):
            raise doc.error((), data, "a config file must be a mapping of keys (schema:, data:, model:, ...)")
        return doc

    def _check_nodes(self, node, loc: tuple, seen_nodes: set) -> None:
        """Refuse a key written twice (YAML keeps the last of two silently) and text that is not valid
        Unicode (a lone surrogate, ``"\\ud800"``, cannot be written to a file name, a log or stdout).
        Each node once: an alias is the node it names, already checked where it was written."""
        import yaml
        if id(node) in seen_nodes:
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            try:
                node.value.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{self.path}:{node.start_mark.line + 1}: {dotted(loc)}: got {show(node.value)}; "
                                  "text must be valid Unicode (no lone surrogates \\ud800-\\udfff)") from None
        elif isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key, value in node.value:
                name = key.value
                self._check_nodes(key, loc + (name,), seen_nodes)
                if name in seen:
                    raise ConfigError(f"{self.path}:{key.start_mark.line + 1}: {dotted(loc + (name,))}: key written "
                                      f"twice (first on line {seen[name]}); keep one")
                seen[name] = key.start_mark.line + 1
                self._check_nodes(value, loc + (name,), seen_nodes)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check_nodes(item, loc + (i,), seen_nodes)

    def _walk(self, loc: tuple):
        """(deepest node reached, its key node or None, the loc parts that reached it)."""
        import yaml
        node, key_node, used = self.root, None, ()
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                match = next(((k, v) for k, v in node.value if k.value == part), None)
                if match is None:
                    continue  # a union tag or a missing key: not written in the file
                key_node, node = match
                used += (part,)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node, key_node, used = node.value[part], None, used + (part,)
        return node, key_node, used

    def line(self, loc: tuple, *, key: bool = False) -> int:
        """1-based line of the value at `loc` (of its key with ``key=True`` or for a mapping); the deepest
        existing part."""
        import yaml
        node, key_node, _ = self._walk(loc)
        if key_node is not None and (key or isinstance(node, yaml.MappingNode)):
            node = key_node  # a block mapping starts on the line after its key: name the key's line
        return node.start_mark.line + 1 if node is not None else 1

    def error(self, loc: tuple, value: Any, allowed: str, *, key: bool = False) -> ConfigError:
        """A one-line ConfigError ``file:line: field.path: got VALUE; ALLOWED``."""
        got = "" if value is NOT_GIVEN else f"got {show(value)}; "
        return ConfigError(f"{self.path}:{self.line(loc, key=key)}: {dotted(loc)}: {got}{allowed}")

    def missing(self, loc: tuple, allowed: str) -> ConfigError:
        """A ConfigError for a required key that is not written (the line of its parent)."""
        return ConfigError(f"{self.path}:{self.line(loc[:-1], key=True)}: {dotted(loc)}: required key is missing; "
                           f"{allowed}")

    def validation_error(self, exc) -> ConfigError:
        """The first (by line) of a pydantic ValidationError's errors, as one line."""
        errors = [self._one(e) for e in exc.errors(include_url=False)]
        errors.sort(key=lambda pair: pair[0])
        line, message = errors[0]
        more = f" (and {len(errors) - 1} more mistake{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        return ConfigError(f"{self.path}:{line}: {message}{more}")

    def _one(self, e: dict) -> tuple[int, str]:
        loc, kind, ctx = tuple(e["loc"]), e["type"], e.get("ctx") or {}
        _, _, used = self._walk(loc)
        if kind == "unknown_key":
            where = used + (ctx["key"],)
            return self.line(where, key=True), (f"{dotted(where)}: unknown key (value {show(ctx['value'])}); "
                                                f"allowed keys: {ctx['allowed']}{did_you_mean(ctx)}")
        if kind == "missing":
            return self.line(loc[:-1], key=True), f"{dotted(used + loc[-1:])}: required key is missing"
        if kind in ("union_tag_invalid", "union_tag_not_found"):  # the model's type: (the one tagged union)
            from .config_schema import MODEL_TYPES
            where = used + (ctx.get("discriminator", "").strip("'"),)
            expected = ctx.get("expected_tags") or ", ".join(map(repr, MODEL_TYPES))
            if kind == "union_tag_not_found":
                return self.line(used, key=True), f"{dotted(where)}: required key is missing; one of {expected}"
            return self.line(where), f"{dotted(where)}: got {show(ctx.get('tag'))}; must be one of {expected}"
        message = e["msg"].replace("Input should be", "must be").replace("Value error, ", "")
        return self.line(loc), f"{dotted(used)}: got {show(e['input'])}; {message}"
