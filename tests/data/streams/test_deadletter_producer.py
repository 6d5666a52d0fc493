"""DeadLetterProducer against the real broker: a full queue is waited out, undelivered letters are reported."""
import logging
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from recstream.data.streams.deadletter import DeadLetter, DeadLetterError, DeadLetterProducer
from recstream.data.streams.records import BadRecord
from recstream.testing import free_port


def read_topic(broker, topic, n, timeout=20):
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"read-{topic}"})
    c.assign([TopicPartition(topic, 0, 0)])
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += [m.value() for m in c.consume(50, 0.5) if m.error() is None]
    c.close()
    return got


def test_a_plain_producer_overflows_a_small_queue(broker, topic):
    """The fault reproduced: produce() into a full queue raises BufferError (the old forward lost the letter)."""
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "queue.buffering.max.messages": 3,
                  "linger.ms": 1000})
    with pytest.raises(BufferError):
        for i in range(10):
            p.produce(topic(1), b"%d" % i)
    p.flush(10)


def test_full_queue_is_waited_out_and_every_letter_arrives(broker, topic):
    t = topic(1)
    dl = DeadLetterProducer(broker.bootstrap_servers, t, {"queue.buffering.max.messages": 3, "linger.ms": 20})
    for i in range(40):
        dl(b"letter %d" % i)
    dl.close()
    assert (dl.produced, dl.delivered, dl.undelivered) == (40, 40, 0)
    assert read_topic(broker, t, 40) == [b"letter %d" % i for i in range(40)]


def test_unreachable_broker_fails_loudly_and_counts_undelivered(caplog):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    dl = DeadLetterProducer(dead, "dlq", {"queue.buffering.max.messages": 2, "message.timeout.ms": 1500,
                                          "log_level": 0},
                            max_block=0.5, flush_timeout=5)
    dl(b"a")
    dl(b"b")
    start = time.monotonic()
    with pytest.raises(DeadLetterError, match="stayed full for 0.5 s"):
        dl(b"c")  # the queue never drains: raise instead of dropping it
    assert time.monotonic() - start < 5
    with caplog.at_level(logging.ERROR, logger="recstream.data.streams"):
        dl.close()  # the two queued letters time out: reported by the delivery callback
    assert dl.undelivered == 2 and dl.delivered == 0
    assert caplog.text.count("dead letter NOT delivered") == 2


def test_dead_letter_close_flushes_its_producer(broker, topic):
    t = topic(1)
    producer = DeadLetterProducer(broker.bootstrap_servers, t, {"linger.ms": 5000})  # would sit queued 5 s
    dl = DeadLetter(forward=producer)
    dl.write([BadRecord(0, "unparsable", "cannot parse 'x'", b"1,x")], [{"topic": "src", "partition": 0,
                                                                           "offset": 4}])
    dl.close()  # flushes now instead of leaving the letter queued in a producer about to be dropped
    assert producer.delivered == 1
    assert b'"offset": 4' in read_topic(broker, t, 1)[0]
