"""`DirectoryIndex`: the data files of a followed directory, listed once and kept.

A stream that follows a directory reads its files in name order. Listing the directory for
each new file costs a full ``scandir`` (and sort) of everything in it, consumed files included:
with tens of thousands of consumed files present that is most of the time spent per file. The
index lists the directory only when what it knows is exhausted, and keeps, sorted, the names
at or after the reading point (the *floor*); moving on to the next file is a binary search.

It is a cache, never a source of truth: it is rebuilt by a scan from whatever floor the stream
resumes at (its checkpointed position), and `scan` also reports names that appeared
*before* the floor since the previous scan (files that arrived too late to be read in order).

A scan of an unchanged directory is skipped: the directory's modification time moves whenever
an entry is added, removed or renamed. Timestamps are coarse, so the skip is trusted only for a
directory last modified ``SETTLE_S`` seconds or more before the previous scan began, and a full
scan still runs at least every ``RESCAN_S`` seconds.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> for i in range(4):
...     _ = open(os.path.join(d, f"part-{i}.csv"), "w").write("1\\n")
>>> index = DirectoryIndex(d, "*.csv")
>>> index.scan("part-1.csv")  # the first scan: nothing is late yet
[]
>>> index.after("part-1.csv"), index.after("part-1.csv", inclusive=True)
(['part-2.csv', 'part-3.csv'], ['part-1.csv', 'part-2.csv', 'part-3.csv'])
>>> _ = open(os.path.join(d, "part-0a.csv"), "w").write("1\\n")
>>> index.scan("part-2.csv", force=True)  # a new name before the floor: late
['part-0a.csv']
"""
from __future__ import annotations

import bisect
import fnmatch
import os
import time

SETTLE_S = 2.0   # a directory modified this long before a scan began cannot change unseen
RESCAN_S = 5.0   # and one full scan at least this often, whatever the timestamps say


class DirectoryIndex:
    """Sorted names (of every rank) at or after a floor, from as few directory scans as possible."""

    def __init__(self, path: str, pattern: str) -> None:
        self.path, self.pattern = path, pattern
        self.scans = 0            # full scans done (tests and benchmarks read it)
        self._seen: set[str] | None = None  # every name of the last scan; None before the first
        self.reset()

    def reset(self, forget_seen: bool = False) -> None:
        """Forget the names ahead (after a seek: the floor moved); `forget_seen`: late detection too."""
        self._ahead: list[str] = []
        self._floor: str | None = None
        self._stamp: tuple[int, float, float] | None = None  # (dir mtime_ns, wall time, monotonic) of the scan
        if forget_seen:
            self._seen = None

    def after(self, floor: str | None, inclusive: bool = False) -> list[str]:
        """The known names after `floor` (at or after it: `inclusive`), sorted; no scan."""
        if floor is None:
            return self._ahead
        cut = (bisect.bisect_left if inclusive else bisect.bisect_right)(self._ahead, floor)
        return self._ahead[cut:]

    def covers(self, floor: str | None) -> bool:
        """Whether the names known include everything at or after `floor` as of the last scan."""
        return self._stamp is not None and (self._floor is None or (floor is not None and floor >= self._floor))

    def scan(self, floor: str | None, force: bool = False) -> list[str]:
        """List the directory (unless it cannot have changed); keep the names at or after `floor`;
        return the names before `floor` that the previous scan did not see (late arrivals)."""
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            mtime = None
        if not force and self._unchanged(mtime) and self.covers(floor):
            return []
        wall, mono = time.time(), time.monotonic()
        names = [e.name for e in os.scandir(self.path) if not e.name.startswith((".", "_"))
                 and fnmatch.fnmatchcase(e.name, self.pattern) and e.is_file()]
        self.scans += 1
        ahead = sorted(n for n in names if floor is None or n >= floor)
        late = [] if self._seen is None or floor is None else \
            sorted(n for n in names if n < floor and n not in self._seen)
        self._seen = set(names)
        self._ahead, self._floor = ahead, floor
        self._stamp = None if mtime is None else (mtime, wall, mono)
        return late

    def _unchanged(self, mtime: int | None) -> bool:
        if self._stamp is None or mtime is None:
            return False
        last_mtime, wall, mono = self._stamp
        return (mtime == last_mtime and wall - mtime / 1e9 >= SETTLE_S
                and time.monotonic() - mono < RESCAN_S)
