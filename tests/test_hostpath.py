"""`recstream.hostpath`: the kept index vectors that a step's ops take views of."""
import gc
import weakref

import torch

from recstream import hostpath


def test_an_outgrown_kept_arange_stays_alive_for_the_graphs_captured_with_it():
    # A CUDA graph captured with a view of the kept arange reads that memory at every replay: when a
    # longer one is kept, the shorter one must not be freed (its memory would go to other tensors).
    short = hostpath.positions(8, "cpu", torch.int16)
    kept = weakref.ref(short._base)
    longest = short._base.numel()
    del short
    longer = hostpath.positions(longest + 1, "cpu", torch.int16)
    gc.collect()
    assert kept() is not None and longer.tolist() == list(range(longest + 1))
