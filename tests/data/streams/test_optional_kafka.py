"""confluent-kafka is an optional extra: without it everything but Kafka works, and Kafka says what to install."""
import subprocess
import sys

CODE = """
import sys
sys.modules["confluent_kafka"] = None  # as if the extra were not installed
import recstream.data.streams as streams
from recstream.data.streams import DirectoryStream  # the other sources work
try:
    streams.KafkaStream
except ImportError as e:
    print("ERR", e)
"""


def test_kafka_stream_without_the_client_names_the_extra():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERR KafkaStream needs the Kafka client: pip install 'recstream[kafka]'" in out.stdout
