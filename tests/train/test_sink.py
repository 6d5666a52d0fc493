"""Sink mode: per-epoch sink sizes, continuation, hooks once per sink, background producer."""
import threading

import pytest
import torch

from recstream.train import DatasetHelper, TrainOneStepCell, WithLossCell, connect_network_with_dataset
from recstream.train import sink as sink_module
from recstream.train.sink import DataChannel

from .helpers import MSDataset, Recorder, batches, linear_model


class Tagged:
    """Batches whose first feature column carries the batch index, and which threads produced them."""

    def __init__(self, n):
        self.data = [(torch.full((2, 4), float(i)), torch.zeros(2, dtype=torch.long)) for i in range(n)]
        self.threads = set()

    def __len__(self):
        return len(self.data)

    def __iter__(self):
        for b in self.data:
            self.threads.add(threading.current_thread().name)
            yield b


class SeenNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.seen = []

    def forward(self, x):
        self.seen.append(int(x[0, 0]))
        return self.lin(x)


def _sink_model():
    from recstream import Model
    net = SeenNet()
    return net, Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)


def test_sink_size_continues_across_epochs_and_cycles_dataset(monkeypatch):
    # A core that training leaves free: the sink prefetches on its thread (whatever this machine has).
    monkeypatch.setattr(sink_module, "available_cores", lambda: torch.get_num_threads() + 1)
    net, model = _sink_model()
    data, rec = Tagged(5), Recorder()
    model.train(4, data, callbacks=[rec], dataset_sink_mode=True, sink_size=3)
    assert net.seen == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]  # 4 epochs x 3 batches, continuing
    assert [c[2] for c in rec.calls if c[0] == "step_end"] == [3, 6, 9, 12]  # one step hook per sink
    assert [c[2] for c in rec.calls if c[0] == "step_begin"] == [3, 6, 9, 12]
    assert rec.params.batch_num == 3 and rec.params.dataset_sink_mode is True
    assert data.threads == {"recstream-data-channel"}  # produced on the background thread


def test_sink_size_minus_one_is_a_full_pass_per_epoch():
    net, model = _sink_model()
    ds, rec = MSDataset(Tagged(4).data), Recorder()
    model.train(2, ds, callbacks=[rec], dataset_sink_mode=True)
    assert net.seen == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [c[2] for c in rec.calls if c[0] == "step_end"] == [4, 8]
    assert rec.params.batch_num == 4


def test_train_dataset_element_is_the_sinks_first_batch():
    elements = []
    rec = Recorder()
    rec.on_train_step_begin = lambda ctx: elements.append(int(ctx.original_args().train_dataset_element[0][0, 0]))
    _, model = _sink_model()
    model.train(2, Tagged(5), callbacks=[rec], dataset_sink_mode=True, sink_size=2)
    assert elements == [0, 2]


def test_no_host_read_of_the_loss_in_sink_mode(monkeypatch):
    """Without callbacks that print, training never converts a tensor to a Python number."""
    def forbidden(*_):
        raise AssertionError("host sync on the training path")

    _, model = _sink_model()
    monkeypatch.setattr(torch.Tensor, "item", forbidden)
    monkeypatch.setattr(torch.Tensor, "__float__", forbidden)
    model.train(2, Tagged(4), dataset_sink_mode=True, sink_size=4)


def test_stop_request_in_sink_mode_ends_after_the_epoch():
    rec = Recorder(stop_at=("step_end", 2, 6))
    _, model = _sink_model()
    model.train(5, Tagged(5), callbacks=[rec], dataset_sink_mode=True, sink_size=3)
    assert rec.calls[-1] == ("train_end", 2, 6)


def test_producer_error_is_raised_in_the_training_thread():
    class Broken:
        def __len__(self):
            return 3

        def __iter__(self):
            yield batches(1)[0]
            raise RuntimeError("bad record in file x.csv row 2")

    with pytest.raises(RuntimeError, match="row 2"):
        linear_model().train(1, Broken(), dataset_sink_mode=True)


def test_one_shot_generator_cannot_be_cycled():
    gen = (b for b in batches(2))
    with pytest.raises(ValueError, match="cannot be traversed again"):
        linear_model().train(3, gen, dataset_sink_mode=True, sink_size=2)


def test_unsized_dataset_needs_positive_sink_size():
    gen = (b for b in batches(2))
    with pytest.raises(ValueError, match="sink_size"):
        linear_model().train(1, gen, dataset_sink_mode=True, sink_size=-1)


def test_custom_loop_with_dataset_helper():
    net = torch.nn.Linear(4, 2)
    step = TrainOneStepCell(WithLossCell(net, torch.nn.CrossEntropyLoss()), torch.optim.SGD(net.parameters(), lr=0.1))
    helper = DatasetHelper(batches(5), dataset_sink_mode=True, sink_size=2, epoch_num=3)
    train = connect_network_with_dataset(step, helper)
    losses = [train(*inputs) for _ in range(3) for inputs in helper]
    assert len(losses) == 3 and helper.steps_done == 6
    helper = DatasetHelper(batches(5), dataset_sink_mode=False)
    assert connect_network_with_dataset(step, helper) is step
    assert sum(1 for _ in helper) == 5


def test_channel_close_stops_an_endless_producer():
    def endless():
        while True:
            yield torch.zeros(1)

    class Endless:
        def __iter__(self):
            return endless()

    channel = DataChannel(Endless(), depth=2, total=None)
    channel.get()
    channel.close()
    assert not channel._thread.is_alive()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sink_on_cuda_copies_on_the_side_stream_in_order_and_trains_like_the_plain_loop():
    """On CUDA the channel pins each batch and copies it on a side stream from its own thread; a step
    must wait for its copy (one that did not would read a half-written batch): the batches arrive in
    order, and sink and plain loop end with the same weights."""
    from recstream import Model
    net, model = _sink_model()
    net.cuda()
    data = Tagged(6)
    model.train(2, data, dataset_sink_mode=True)
    assert net.seen == [0, 1, 2, 3, 4, 5] * 2 and data.threads == {"recstream-data-channel"}

    g = torch.Generator().manual_seed(0)
    big = [(torch.randn(4096, 32, generator=g), torch.randint(0, 2, (4096,), generator=g)) for _ in range(12)]
    weights = {}
    for sink in (False, True):
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)).cuda()
        Model(mlp, torch.nn.CrossEntropyLoss(), torch.optim.Adam(mlp.parameters(), lr=1e-3),
              progress_bar=False).train(2, big, dataset_sink_mode=sink)
        weights[sink] = [p.detach().cpu() for p in mlp.parameters()]
    for a, b in zip(weights[False], weights[True], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
