"""A minimal in-memory stream implementing the position protocol (position/seek/commit/meta).

Batch i has every feature equal to i, so a network can record exactly which batches it trained.
"""
import threading
import time

import torch


def batch(i: int):
    return torch.full((2, 4), float(i)), torch.tensor([i % 2, (i + 1) % 2])


class CountingStream:
    def __init__(self, limit=None, idle_after=None):
        self.next, self.limit, self.idle_after = 0, limit, idle_after
        self.commits, self.threads = [], set()

    def __iter__(self):
        while self.limit is None or self.next < self.limit:
            if self.idle_after is not None and self.next >= self.idle_after:
                time.sleep(0.01)  # an idle source: no data arrives
                continue
            i = self.next
            self.next += 1
            self.threads.add(threading.current_thread().name)
            yield batch(i)

    def position(self):
        return {"next": self.next}

    def last_batch_meta(self):
        return {"ids": [self.next - 1]}

    def seek(self, position):
        self.next = position["next"]

    def commit(self, position):
        self.commits.append(dict(position))


class SeenNet(torch.nn.Module):
    """A linear classifier that also records, in a buffer, how often each batch id was trained."""

    def __init__(self, max_ids=1000):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.register_buffer("seen", torch.zeros(max_ids, dtype=torch.int64))

    def forward(self, x):
        if self.training:
            self.seen[x[0, 0].long()] += 1
        return self.lin(x)
