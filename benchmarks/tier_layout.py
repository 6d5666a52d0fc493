"""The per-step file work of a cache-full disk tier in two layouts: three files of ``--dim`` floats
(weights and two moments, a store of format version 1) against one file of records (a row's
weights and moments side by side, as the store keeps them now); with ``--pwrite``, also the records
written by ``pwrite``, a system call a row, instead of through the map (a write to a page the kernel
wrote back then takes no page fault, but each call is the kernel's write path); with ``--private``,
also the records written through a private (copy-on-write) map, their dirty pages written to the
file by ``pwrite`` every ``--flush`` steps, as a commit would (the kernel's write-back never meets a
page the step writes). With ``--clean N``,
every file is written back (msync) every N steps, as the kernel does with dirty pages over a long
run, after which the next write through a map to each page is a page fault.

Each step writes ``--rows-per-step`` rows scattered over the table (the evicted ones), reads as
many others (the prefetched ones) and, with ``--preimages``, reads the written rows first (the undo
log's pre-images). The files are created in ``--dir`` (default: a temporary directory under the
current one, on the disk the store would use) and removed after.

    python benchmarks/tier_layout.py --clean 0     # pages never written back (a run of seconds)
    python benchmarks/tier_layout.py --clean 40    # written back every 40 steps (a run of minutes)

Prints one JSON document: per layout, ms of the file work per step, page faults per step and
kernel CPU ms per step (the write-backs' own CPU included).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import shutil
import tempfile
import time

import numpy as np


def _file(directory: str, name: str, rows: int, cols: int) -> tuple[mmap.mmap, np.ndarray]:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.truncate(rows * cols * 4)
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, rows * cols * 4)
    os.close(fd)  # (the map keeps the file)
    a = np.frombuffer(m, dtype=np.float32).reshape(rows, cols)
    a[:] = 1.0  # every page allocated and in the page cache, as a store's after its creation
    m.flush()
    return m, a


def _pwrite(m: mmap.mmap, a: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """Rows written with one ``pwrite`` each, at their offsets in the file of map `m`."""
    fd = _FDS[id(m)]
    width = 4 * a.shape[1]
    for row, value in zip(rows.tolist(), values, strict=True):
        os.pwrite(fd, value, row * width)


_FDS: dict[int, int] = {}  # a map's file, open for pwrite


def _private(directory: str, name: str, rows: int, cols: int) -> tuple[mmap.mmap, np.ndarray]:
    """A private (copy-on-write) map of the file `_file` made: its writes never reach the file, nor
    the kernel's write-back, until `_flush_private` writes the pages they dirtied with ``pwrite``."""
    fd = os.open(os.path.join(directory, name), os.O_RDWR)
    m = mmap.mmap(fd, rows * cols * 4, flags=mmap.MAP_PRIVATE)
    _FDS[id(m)] = fd
    _DIRTY[id(m)] = np.zeros((rows * cols * 4 + mmap.PAGESIZE - 1) // mmap.PAGESIZE, dtype=bool)
    return m, np.frombuffer(m, dtype=np.float32).reshape(rows, cols)


def _flush_private(m: mmap.mmap) -> None:
    """The pages of private map `m` written since the last flush, written to its file (one ``pwrite`` a
    run of consecutive pages) and synced, as a commit would."""
    dirty, fd, view = _DIRTY[id(m)], _FDS[id(m)], memoryview(m)
    pages = np.flatnonzero(dirty)
    if pages.size:
        starts = pages[np.r_[True, np.diff(pages) > 1]]
        ends = pages[np.r_[np.diff(pages) > 1, True]] + 1
        for a, e in zip((starts * mmap.PAGESIZE).tolist(), (ends * mmap.PAGESIZE).tolist(), strict=True):
            os.pwrite(fd, view[a:min(e, len(m))], a)
        os.fsync(fd)
    dirty[:] = False


_DIRTY: dict[int, np.ndarray] = {}  # a private map's pages written since its last flush


def _steps(files, args, rng, mode: str = "map") -> dict:
    """The per-step work on `files` [(map, rows x cols array)] written by `mode` (``map``, ``pwrite`` or
    ``private``: through a private map, flushed every ``--flush`` steps), timed (the kernel's write-backs
    not included; the private map's flushes included)."""
    seconds = 0.0
    before = resource.getrusage(resource.RUSAGE_SELF)
    for step in range(args.steps):
        written = np.unique(rng.integers(0, args.rows, args.rows_per_step))
        read = np.unique(rng.integers(0, args.rows, args.rows_per_step))
        t0 = time.perf_counter()
        for m, a in files:
            row = np.dtype((np.void, 4 * a.shape[1]))  # one item a row: a row copy each
            if args.preimages:
                np.take(a, written, axis=0)
            values = np.ones((written.size, a.shape[1]), np.float32)
            if mode == "pwrite":
                _pwrite(m, a, written, values)
            else:
                a.view(row)[written, 0] = values.view(row)[:, 0]
            if mode == "private":
                _DIRTY[id(m)][written * (4 * a.shape[1]) // mmap.PAGESIZE] = True
                if step % args.flush == args.flush - 1:
                    _flush_private(m)
            np.take(a, read, axis=0)
        seconds += time.perf_counter() - t0
        if args.clean and step % args.clean == args.clean - 1:
            for m, _ in files:
                m.flush()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"ms_per_step": 1e3 * seconds / args.steps,
            "page_faults_per_step": (after.ru_minflt - before.ru_minflt) / args.steps,
            "kernel_ms_per_step": 1e3 * (after.ru_stime - before.ru_stime) / args.steps}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--rows-per-step", type=int, default=3_900)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--clean", type=int, default=0, help="write every file back every N steps (0: never)")
    p.add_argument("--preimages", action="store_true", help="read the written rows first, as the undo log does")
    p.add_argument("--pwrite", action="store_true", help="also the records written by pwrite, a call a row")
    p.add_argument("--private", action="store_true",
                   help="also the records written through a private map, flushed by pwrite every --flush steps")
    p.add_argument("--flush", type=int, default=400, help="steps between a private map's flushes (a commit's)")
    p.add_argument("--only", nargs="*", default=None, help="time only these layouts (names as printed)")
    p.add_argument("--rounds", type=int, default=2, help="each layout in turn, this many times")
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    directory = tempfile.mkdtemp(dir=args.dir or os.getcwd(), prefix="tier_layout_")
    try:
        records = [_file(directory, "records", args.rows, 3 * args.dim)]
        layouts = {"three files": ([_file(directory, f"a{i}", args.rows, args.dim) for i in range(3)], "map"),
                   "one record": (records, "map")}
        if args.pwrite:
            layouts["one record, pwrite"] = (records, "pwrite")
        if args.private:
            layouts["one record, private map"] = ([_private(directory, "records", args.rows, 3 * args.dim)], "private")
        _FDS[id(records[0][0])] = os.open(os.path.join(directory, "records"), os.O_RDWR)
        rng = np.random.default_rng(0)
        if args.only is not None:
            layouts = {name: layout for name, layout in layouts.items() if name in args.only}
        runs = {name: [] for name in layouts}
        for _ in range(args.rounds):
            for name, (files, mode) in layouts.items():
                runs[name].append(_steps(files, args, rng, mode))
        for fd in _FDS.values():
            os.close(fd)
        _FDS.clear()
        _DIRTY.clear()
        del layouts, records  # (the maps close with their arrays)
    finally:
        shutil.rmtree(directory)
    result = {"args": vars(args), "runs": runs}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
