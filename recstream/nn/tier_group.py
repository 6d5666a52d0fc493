"""How a tier store's arrays lie in its files: groups of arrays, each array a `TierArray`.

A store's arrays made together (a table's weights and its optimizer's per-row state) share one
`TierFile` whose rows are records, ``[weight | exp_avg | exp_avg_sq]`` for LazyAdam: a row read or
written back touches one page and logs one pre-image, where a file per array touched three pages and
logged three. Over a long run the kernel writes the files' dirty pages back, and each first write to
such a page afterwards is a page fault: there the per-step file work of a cache-full 4M-row table was
3-4x that of one file of records (``benchmarks/tier_layout.py --clean 40``). An array added once the
store holds trained rows gets a group (a file) of its own; a store written before groups existed
(manifest version 1) reads as a group per array, in ``{name}.tier``.

Example:
    >>> import tempfile, numpy as np
    >>> from recstream.nn.tier_file import TierFile
    >>> d = tempfile.mkdtemp()
    >>> spec = GroupSpec("group-0.tier", (("weight", 2), ("exp_avg", 2)))
    >>> fill = group_fill([(2, lambda a, b: np.ones((b - a, 2), np.float32)), (2, 0.0)])
    >>> f = TierFile.create(f"{d}/group-0.tier", 5, spec.cols, fill)
    >>> arrays = group_arrays([spec], [f])
    >>> arrays["exp_avg"].read_rows(np.array([3])).tolist(), arrays["weight"].cols
    ([[0.0, 0.0]], 2)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .tier_file import TierFile, TierFileError

__all__ = ["GroupSpec", "TierArray", "group_arrays", "group_fill", "open_groups", "specs_of"]

Fill = Callable[[int, int], np.ndarray] | float  # rows [a, b), or one value for every row


@dataclass(frozen=True)
class GroupSpec:
    """One file of a store: its name in the store's directory and its arrays, ``(name, cols)`` in
    column order."""

    file: str
    arrays: tuple[tuple[str, int], ...]

    @property
    def cols(self) -> int:
        return sum(cols for _, cols in self.arrays)

    def as_json(self) -> dict:
        return {"file": self.file, "arrays": [[name, cols] for name, cols in self.arrays]}


class TierArray:
    """Array `name` of a store: columns ``[start, stop)`` of the records of group file `file` (the
    store's group `group`)."""

    __slots__ = ("name", "group", "file", "start", "stop")

    def __init__(self, name: str, group: int, file: TierFile, start: int, stop: int) -> None:
        self.name, self.group, self.file, self.start, self.stop = name, group, file, start, stop

    @property
    def rows(self) -> int:
        return self.file.rows

    @property
    def cols(self) -> int:
        return self.stop - self.start

    @property
    def whole(self) -> bool:
        """Whether the array is its file's whole record."""
        return self.start == 0 and self.stop == self.file.cols

    def columns(self, records: np.ndarray) -> np.ndarray:
        """This array's part of `records` (rows of its file; a view)."""
        return records if self.whole else records[:, self.start:self.stop]

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` of this array (a contiguous copy; blocks checked, as `TierFile.read_rows`)."""
        return np.ascontiguousarray(self.columns(self.file.read_rows(rows)))

    def verify_all(self) -> None:
        self.file.verify_all()


def group_arrays(specs: list[GroupSpec], files: list[TierFile]) -> dict[str, TierArray]:
    """Every array of the groups `specs`, whose files are `files`, by name."""
    out: dict[str, TierArray] = {}
    for g, (spec, f) in enumerate(zip(specs, files, strict=True)):
        start = 0
        for name, cols in spec.arrays:
            out[name] = TierArray(name, g, f, start, start + cols)
            start += cols
    return out


def specs_of(manifest: dict, where: str) -> list[GroupSpec]:
    """The groups a store's manifest names (version 1: a file per array, ``{name}.tier``)."""
    try:
        if manifest.get("version", 1) == 1:
            return [GroupSpec(f"{name}.tier", ((name, int(f["cols"])),)) for name, f in manifest["files"].items()]
        return [GroupSpec(str(g["file"]), tuple((str(n), int(c)) for n, c in g["arrays"])) for g in manifest["groups"]]
    except (KeyError, TypeError, ValueError) as e:
        raise TierFileError(f"tier store {where}: its manifest does not describe its files ({e!r})") from e


def open_groups(directory: str, specs: list[GroupSpec]) -> list[TierFile]:
    """The group files of `specs` in `directory`, opened (each file's width checked against its spec)."""
    files: list[TierFile] = []
    try:
        for spec in specs:
            f = TierFile.open(os.path.join(directory, spec.file))
            files.append(f)
            if f.cols != spec.cols:
                raise TierFileError(f"tier file {f.path}: {f.cols} columns, its store's manifest says {spec.cols}")
    except BaseException:
        for f in files:
            f.close()
        raise
    return files


def group_fill(parts: list[tuple[int, Fill]]) -> Fill:
    """The fill of a group file from its arrays' ``(cols, fill)``: their one value if every fill is
    that value (the file is then a constant one: sparse where it is zeros), else records assembled
    from each array's rows."""
    values = {float(fill) for _, fill in parts if not callable(fill)}
    if len(values) == 1 and not any(callable(fill) for _, fill in parts):
        return values.pop()

    def fill(a: int, b: int) -> np.ndarray:
        out = np.empty((b - a, sum(cols for cols, _ in parts)), dtype=np.float32)
        start = 0
        for cols, part in parts:
            out[:, start:start + cols] = part(a, b) if callable(part) else float(part)
            start += cols
        return out

    return fill
