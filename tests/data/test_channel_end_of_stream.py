"""The one walk over a dataset (`traverse`), what an empty pass means (`EndOfStream`), the one
reading of positions (`Marks`), and DataChannel's typed options."""
import threading

import pytest
import torch

from recstream.data.channel import (
    DONE,
    END_OF_PASS,
    ChannelOptions,
    DataChannel,
    EndOfStream,
    Item,
    Marks,
    traverse,
)
from recstream.train.sink import DatasetHelper


class Counting:
    """Positions and metadata; records which thread read them."""

    def __init__(self, n):
        self.n, self.next, self.readers = n, 0, set()

    def __iter__(self):
        while self.next < self.n:
            self.next += 1
            yield (torch.full((1, 1), float(self.next)), torch.zeros(1))

    def position(self):
        self.readers.add(threading.current_thread().name)
        return {"next": self.next}

    def seek(self, position):
        self.next = position["next"]

    def last_batch_meta(self):
        return {"ids": [self.next]}


@pytest.mark.parametrize("end, before, endless, expected", [
    (EndOfStream.EMPTY_PASS, 0, True, True), (EndOfStream.EMPTY_PASS, 3, False, True),
    (EndOfStream.AFTER_DATA, 2, True, True), (EndOfStream.AFTER_DATA, 2, False, True),
    (EndOfStream.NEVER, 1, False, False),  # a later epoch's empty pass: trains nothing
])
def test_what_an_empty_pass_means(end, before, endless, expected):
    assert end.empty_pass(before, endless=endless) is expected


@pytest.mark.parametrize("end, before, endless, message", [
    (EndOfStream.AFTER_DATA, 0, True, "no batch at all"), (EndOfStream.NEVER, 0, False, "no batch at all"),
    (EndOfStream.NEVER, 0, True, "no batch in a pass"), (EndOfStream.NEVER, 5, True, "no batch in a pass"),
])
def test_an_empty_pass_that_is_a_mistake_says_so(end, before, endless, message):
    with pytest.raises(ValueError, match=f"'data' yielded {message}"):
        end.empty_pass(before, "data", endless=endless)


def test_an_endless_walk_ends_where_the_policy_says_the_source_ended():
    class Once:  # one pass with batches, then empty passes
        def __init__(self):
            self.passes = 0

        def __iter__(self):
            self.passes += 1
            return iter([1, 2] if self.passes == 1 else [])

    assert list(traverse(Once(), end=EndOfStream.AFTER_DATA)) == [1, 2]
    assert list(traverse([], end=EndOfStream.EMPTY_PASS)) == []
    with pytest.raises(ValueError, match="no batch in a pass"):
        list(traverse(Once()))  # offline: the second, empty pass would spin
    assert list(traverse([1], passes=2, reset_after_pass=False)) == [1, END_OF_PASS, 1, END_OF_PASS]


def test_marks_read_position_and_metadata_right_after_the_batch():
    data = Counting(2)
    marks, it = Marks(data), iter(data)
    item = marks.item(next(it))
    assert isinstance(item, Item) and item.position == {"next": 1} and item.meta == {"ids": [1]}


def test_normal_mode_draws_from_the_same_producer_inline_in_this_thread():
    data = Counting(3)
    helper = DatasetHelper(data, dataset_sink_mode=False, end=EndOfStream.AFTER_DATA, epoch_num=None)
    steps = list(helper.steps())
    assert [s.position for s in steps] == [{"next": 1}, {"next": 2}, {"next": 3}]
    assert [s.metas for s in steps] == [[{"ids": [1]}], [{"ids": [2]}], [{"ids": [3]}]]
    assert data.readers == {threading.current_thread().name} and not helper.ended
    assert list(helper.steps()) == [] and helper.ended  # an empty pass after data: the source ended


def test_channel_options_are_typed_and_unknown_keywords_are_refused():
    channel = DataChannel([1, 2], passes=1, options=ChannelOptions(background=False))
    assert [channel.get().batch, channel.get().batch, channel.get(), channel.get()] == [1, 2, END_OF_PASS, DONE]
    with pytest.raises(TypeError, match="unexpected keyword argument.*'backgrond'"):
        DataChannel([1], backgrond=False)
    with pytest.raises(TypeError, match="'end'"):
        DataChannel([1], end="empty_pass")
    with pytest.raises(TypeError, match="'background'"):
        ChannelOptions(background="yes")
