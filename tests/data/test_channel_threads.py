"""DataChannel's producer thread sizes its own torch thread pool: the cores training leaves free."""
import threading

import pytest
import torch

from recstream.data import channel as channel_module
from recstream.data.channel import DataChannel


class ThreadsSeen:
    """Yields, per batch, the torch thread count of the thread that iterates it -- only once the
    channel's constructor has returned (a thread's pool can change under it until then)."""

    def __init__(self):
        self.go = threading.Event()

    def __iter__(self):
        assert self.go.wait(5)
        for _ in range(3):
            torch.ones(4).sum()  # a torch op first: it must not reset the thread's pool
            yield torch.get_num_threads()


@pytest.fixture
def two_training_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def seen_in_producer(**kwargs) -> list[int]:
    data = ThreadsSeen()
    channel = DataChannel(data, passes=1, **kwargs)
    data.go.set()
    seen = [channel.get().batch for _ in range(3)]
    channel.close()
    return seen


@pytest.mark.parametrize(("cores", "expected"), [(2, 1), (3, 1), (8, 6)])
def test_the_producer_gets_the_cores_training_leaves_free(monkeypatch, two_training_threads, cores, expected):
    monkeypatch.setattr(channel_module, "available_cores", lambda: cores)
    assert seen_in_producer() == [expected] * 3
    assert torch.get_num_threads() == 2  # training's own count is untouched


def test_an_explicit_count_and_the_default_of_later_threads(two_training_threads):
    assert seen_in_producer(producer_threads=3) == [3] * 3
    # torch.set_num_threads in the producer also set the default of threads started later: put back.
    later = []
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert later == [2]


def test_a_bad_producer_thread_count_is_refused():
    with pytest.raises(ValueError, match="'producer_threads' must be an int >= 1 or None, got 0"):
        DataChannel([1], producer_threads=0)
    with pytest.raises(TypeError, match="'producer_threads'"):
        DataChannel([1], producer_threads=1.5, background=False)
