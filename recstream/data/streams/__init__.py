"""placeholder"""
from .base import Stream
from .deadletter import DeadLetter
from .decoders import CSVLineDecoder, CriteoTSVDecoder
from .iterable import IterableStream
from .json_decoder import JSONDecoder
from .records import REASONS, BadRecord, Decoded
from .directory import DirectoryStream
from .table_decoders import ArrowTableDecoder, RowDecoder
from .broker import BrokerUnavailable, TansuBroker
from .kafka import KafkaStream
