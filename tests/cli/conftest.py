"""The CLI's Kafka tests share the stream tests' local broker fixtures."""
from tests.data.streams.conftest import broker, tansu_binary, topic  # noqa: F401
