"""recstream.data.streams: unbounded sources of Batches for online training, with exact positions.

Sources (all iterables of [`Batch`][recstream.data.batch.Batch] of ``batch_size`` rows that wait for
new data, see `.base` for the protocol the trainer relies on):

* [`IterableStream`][recstream.data.streams.iterable.IterableStream]: any Python iterable of batches or of row dicts.
  Position ``{"batches": n}`` / ``{"records": n}``.
* `DirectoryStream`: files arriving in a directory (CSV/TSV, JSON lines, Criteo TSV,
  Parquet), read once each in name order. Position ``{"file": name, "offset": bytes|rows}``.
* `KafkaStream`: Kafka topics via confluent-kafka, consumer group or explicit
  partitions. Position ``{"topic:partition": next_offset}``.

Every stream has ``position()``, ``seek(position)``, ``commit(position)``, ``reset()``
(no-op), ``close()``, ``last_batch_meta()`` (event ids / times of the last batch), and
``bad_records`` (by reason; each bad record also goes to ``dead_letter`` with its reason
and source position, and the stream goes on).

Decoders (records -> Batch, vectorized with pyarrow, `.decoders`): `CSVLineDecoder`,
`JSONDecoder`, `CriteoTSVDecoder`, `RowDecoder`, `ArrowTableDecoder`.

Producing events is not part of this package: ``recstream produce`` (`recstream.cli.produce`)
writes them into a topic or a directory, and `recstream.testing.TansuBroker` runs a
local Kafka-protocol broker for tests and demos.

>>> import os, tempfile
>>> from recstream.data import Schema
>>> d = tempfile.mkdtemp()
>>> _ = open(os.path.join(d, "part-0.csv"), "w").write("1,0.5\\n0,1.5\\n")
>>> with DirectoryStream(d, Schema(["x"]), batch_size=2, idle_timeout=0.1) as s:
...     [b.labels.tolist() for b in s], s.position()
([[1.0, 0.0]], {'file': 'part-0.csv', 'offset': 12})
"""
from .base import Stream
from .deadletter import DeadLetter
from .decoders import ArrowTableDecoder, CriteoTSVDecoder, CSVLineDecoder, JSONDecoder, RowDecoder
from .directory import DirectoryStream
from .iterable import IterableStream
from .records import REASONS, BadRecord, Decoded

__all__ = [
    "Stream", "IterableStream", "DirectoryStream", "KafkaStream",
    "CSVLineDecoder", "CriteoTSVDecoder", "JSONDecoder", "RowDecoder", "ArrowTableDecoder",
    "DeadLetter", "BadRecord", "Decoded", "REASONS",
]


def __getattr__(name: str):
    # KafkaStream needs confluent-kafka; import it only when asked, so the other sources
    # work without it
    if name == "KafkaStream":
        try:
            from .kafka import KafkaStream
        except ModuleNotFoundError as e:
            if e.name != "confluent_kafka":
                raise
            raise ImportError("KafkaStream needs the Kafka client: pip install 'recstream[kafka]' "
                              "(confluent-kafka)") from e
        return KafkaStream
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
