"""Files per second that `DirectoryStream` consumes while consumed files pile up in its directory.

A long-running online job follows a directory that its producer keeps filling; unless the
operator removes consumed files (see docs/online.md), they stay. For each count of consumed
files already present (``--consumed``, default 0, 20,000 and 100,000), this writes them, then
``--new`` new files (``--rows-per-file`` CSV rows each), resumes a stream after the consumed ones
(as from a checkpoint) and times how fast it delivers every row of the new files. The empty
directory (0 consumed) is the baseline of the same run: ``vs_empty`` is each rate over its
rate, so a flat rate reads 1.0 whatever the machine. ``listings`` counts full directory scans.

    python benchmarks/bench_directory.py --consumed 0 20000 100000 --new 2000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from recstream.data import Schema
from recstream.data.streams import CSVLineDecoder, DirectoryStream

SCHEMA = Schema(["x"])


def write_files(directory: str, start: int, count: int, rows_per_file: int) -> None:
    """Files ``part-<k>.csv`` for k in [start, start + count), each renamed into place."""
    body = "".join(f"1,{i * 0.5}\n" for i in range(rows_per_file)).encode()
    for k in range(start, start + count):
        tmp = os.path.join(directory, f".part-{k:09d}.csv.tmp")
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, os.path.join(directory, f"part-{k:09d}.csv"))


def measure(consumed: int, new: int, rows_per_file: int) -> dict:
    """Files/s consuming `new` files with `consumed` files present before the resume point."""
    directory = tempfile.mkdtemp(prefix="recstream-bench-dir-")
    try:
        write_files(directory, 0, consumed, rows_per_file)
        write_files(directory, consumed, new, rows_per_file)
        # one file a batch: the last batch is full, so the timing never waits for idle_timeout
        stream = DirectoryStream(directory, batch_size=rows_per_file, decoder=CSVLineDecoder(SCHEMA), idle_timeout=5.0)
        if consumed:
            last = f"part-{consumed - 1:09d}.csv"
            stream.seek({"file": last, "offset": os.path.getsize(os.path.join(directory, last))})
        want, rows = new * rows_per_file, 0
        start = time.perf_counter()
        for batch in stream:
            rows += batch.batch_size
            if rows >= want:
                break
        seconds = time.perf_counter() - start
        stream.close()
        if rows != want:
            raise RuntimeError(f"delivered {rows} rows, expected {want}")
        return {"consumed": consumed, "new_files": new, "seconds": round(seconds, 4),
                "files_per_s": round(new / seconds, 1), "listings": stream._index.scans}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--consumed", type=int, nargs="+", default=[0, 20_000, 100_000])
    p.add_argument("--new", type=int, default=2000, help="new files consumed in each measurement")
    p.add_argument("--rows-per-file", type=int, default=10)
    args = p.parse_args(argv)
    counts = sorted(set(args.consumed) | {0})  # the empty directory: the baseline of this run
    results = [measure(c, args.new, args.rows_per_file) for c in counts]
    base = results[0]["files_per_s"]
    for r in results:
        r["vs_empty"] = round(r["files_per_s"] / base, 3)
        print(json.dumps(r), flush=True)
    return results


if __name__ == "__main__":
    main()
