"""DataChannel(background=False): the same producer, driven inline; and when the sink picks it."""
import threading

import pytest
import torch

from recstream.data.channel import DONE, END_OF_PASS, DataChannel
from recstream.train.sink import DatasetHelper


def test_inline_channel_hands_out_the_same_items_and_markers_without_a_thread():
    before = threading.active_count()
    channel = DataChannel([1, 2, 3], passes=2, background=False)
    items = [channel.get() for _ in range(9)]
    assert threading.active_count() == before
    assert [i if i in (END_OF_PASS, DONE) else i.batch for i in items] == [1, 2, 3, END_OF_PASS, 1, 2, 3,
                                                                            END_OF_PASS, DONE]
    assert channel.get() is DONE  # stays done
    channel.close()


def test_inline_channel_raises_the_sources_error_and_refuses_use_after_close():
    def broken():
        yield 1
        raise OSError("disk gone")

    class Once:
        def __iter__(self):
            return broken()

    channel = DataChannel(Once(), passes=1, background=False)
    assert channel.get().batch == 1
    with pytest.raises(OSError, match="disk gone"):
        channel.get()
    closed = DataChannel([1, 2], passes=1, background=False)
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.get()


def test_the_sink_produces_inline_only_when_training_uses_every_core(monkeypatch):
    helper = DatasetHelper([(torch.zeros(1), torch.zeros(1))] * 4, sink_size=2, epoch_num=1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 10 ** 6)  # more threads than cores
    assert helper._background() is False
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert helper._background() is True  # a free core: the thread can overlap
    gpu = DatasetHelper([(torch.zeros(1), torch.zeros(1))] * 4, sink_size=2, epoch_num=1, device="meta")
    assert gpu._background() is True  # a copy to a device to overlap
