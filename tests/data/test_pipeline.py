import gc
import threading
import time

import numpy as np
import pytest
import torch

from recstream.data import Batch, Features, InMemoryDataset, Prefetcher, ShuffleBuffer


def numbered(n, batch_size, start=0):
    """Batches whose row i has dense value i and a multi-hot bag [i, i, ...] of i % 3 ids."""
    rows = np.arange(start, start + n)
    lengths = torch.tensor(rows % 3)[None, :]
    values = torch.from_numpy(np.repeat(rows, rows % 3))
    data = Batch(Features.from_lengths(torch.from_numpy(rows.astype(np.float32))[:, None], values, lengths),
                 torch.from_numpy((rows % 2).astype(np.float32)))
    return InMemoryDataset(data, batch_size)


def row_ids(batches):
    out = []
    for f, y in batches:
        ids = f.dense[:, 0].long()
        bags, offs = f.bag(0)
        for i, r in enumerate(ids.tolist()):  # rows keep their bags and labels when moved
            assert bags[offs[i]:offs[i + 1]].tolist() == [r] * (r % 3) and y[i].item() == r % 2
        out += ids.tolist()
    return out


def test_shuffle_is_a_permutation_with_exact_batches():
    sb = ShuffleBuffer(numbered(1000, 64), buffer_size=200, seed=1)
    batches = list(sb)
    assert [b.batch_size for b in batches] == [64] * 15 + [40]
    order = row_ids(batches)
    assert sorted(order) == list(range(1000)) and order != list(range(1000))
    assert sb.get_dataset_size() == 16
    again = row_ids(sb)
    assert again != order and sorted(again) == sorted(order)  # a new order per pass
    assert row_ids(ShuffleBuffer(numbered(1000, 64), buffer_size=200, seed=1)) == order  # seeded
    early = np.mean(order[:100])
    assert early < 500  # a bounded buffer: the first rows out come from the start of the stream


def test_full_buffer_mixes_everything_and_drop_remainder():
    order = row_ids(ShuffleBuffer(numbered(300, 50), buffer_size=10_000, seed=0, batch_size=32))
    assert abs(np.mean(order[:30]) - 150) < 60
    sb = ShuffleBuffer(numbered(300, 50), buffer_size=64, batch_size=32, drop_remainder=True)
    assert [b.batch_size for b in sb] == [32] * 9 and sb.get_dataset_size() is None


def test_shuffle_errors():
    with pytest.raises(ValueError, match="ShuffleBuffer: 'buffer_size' must be an int >= 1, got 0"):
        ShuffleBuffer(numbered(10, 5), buffer_size=0)
    with pytest.raises(TypeError, match="must yield recstream.data.Batch, got tuple"):
        list(ShuffleBuffer([(1, 2)], buffer_size=4))


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "recstream-prefetch" and t.is_alive()]


def test_prefetcher_passes_everything_in_order_and_is_reiterable():
    src = numbered(100, 8)
    p = Prefetcher(src, depth=3, device="cpu")
    assert row_ids(p) == list(range(100)) and row_ids(p) == list(range(100))
    assert p.get_dataset_size() == 13 and not prefetch_threads()


def test_prefetcher_runs_ahead_by_depth_only():
    pulled = []

    def source():
        for i in range(50):
            pulled.append(i)
            yield i

    class Source:
        def __iter__(self):
            return source()

    it = iter(Prefetcher(Source(), depth=2))
    assert next(it) == 0
    time.sleep(0.3)
    assert len(pulled) <= 1 + 2 + 1  # consumed + queue + one in the producer's hand
    it.close()
    assert not prefetch_threads()


def test_producer_error_is_reraised_and_thread_ends():
    def broken():
        yield from numbered(16, 8)
        raise OSError("disk gone")

    class Source:
        def __iter__(self):
            return broken()

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for b in Prefetcher(Source()):
            got.append(b)
    assert len(got) == 2 and not prefetch_threads()


def test_consumer_break_exception_and_close_stop_the_thread():
    p = Prefetcher(numbered(10_000, 4), depth=2)
    for i, _ in enumerate(p):
        if i == 3:
            break
    gc.collect()
    assert not prefetch_threads()
    with pytest.raises(ZeroDivisionError):
        for _ in Prefetcher(numbered(10_000, 4)):
            _ = 1 / 0
    gc.collect()
    assert not prefetch_threads()
    with Prefetcher(numbered(10_000, 4)) as batches:
        next(batches)
        assert prefetch_threads()
    assert not prefetch_threads()
    with pytest.raises(RuntimeError, match="this pass was closed"):
        next(batches)


def test_prefetcher_arguments():
    with pytest.raises(ValueError, match="'depth' must be an int >= 1, got 0"):
        Prefetcher([], depth=0)
    with pytest.raises(TypeError, match="Prefetcher: 'iterable' must be an iterable"):
        Prefetcher(5)
    assert Prefetcher([], device="cpu").pin_memory is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetcher_to_cuda():
    p = Prefetcher(numbered(100, 8), device="cuda")
    assert p.pin_memory
    got = []
    for f, y in p:
        assert f.values.is_cuda and y.is_cuda
        got.append((f.dense.sum() + y.sum()).item())  # kernels on the consumer's stream
    assert len(got) == 13 and row_ids([b.to("cpu") for b in Prefetcher(numbered(100, 8), device="cuda")]) \
        == list(range(100))
