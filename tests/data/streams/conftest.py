"""Fixtures of the stream tests: a real Kafka-protocol broker (Tansu) and a local PostgreSQL.

Everything listens on 127.0.0.1 and every process started here is stopped at the end
(the broker also dies with the test process: PR_SET_PDEATHSIG). Kafka tests are skipped,
with the reason printed, only when the Tansu binary cannot run at all.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

from recstream.testing import BrokerUnavailable, TansuBroker, find_tansu, free_port


def _skip(reason: str):
    print(f"\nSKIPPING Kafka stream tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tansu_binary() -> str:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as e:
        _skip(f"confluent-kafka is not installed ({e}); pip install confluent-kafka")
    try:
        path = find_tansu()
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (BrokerUnavailable, OSError, subprocess.TimeoutExpired) as e:
        _skip(f"the Tansu broker binary cannot run: {e}")
    if out.returncode != 0:
        _skip(f"the Tansu broker binary cannot run: '{path} --version' exited {out.returncode}: {out.stderr[-500:]}")
    return path


@pytest.fixture(scope="session")
def broker(tansu_binary):
    """One in-memory broker for the session (tests use their own topics)."""
    b = TansuBroker(binary=tansu_binary)
    b.start()
    yield b
    b.stop()


@pytest.fixture
def own_broker(tansu_binary):
    """A broker for one test (one that is paused or restarted)."""
    b = TansuBroker(binary=tansu_binary)
    yield b
    b.stop()


@pytest.fixture
def topic(broker):
    """Factory: a new topic with `partitions` partitions on the session broker."""
    def make(partitions: int = 1) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        broker.create_topic(name, partitions)
        return name
    return make


def _pg_bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


@pytest.fixture
def postgres():
    """A throw-away PostgreSQL cluster on 127.0.0.1 (initdb + pg_ctl in a temp dir); yields its URL."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    root = tempfile.mkdtemp(prefix="recstream-pg-")  # not under pytest's root-only tmp: the server user reads it
    user = None
    if os.geteuid() == 0:  # initdb refuses to run as root: run the cluster as an unprivileged user
        user = "postgres" if _has_user("postgres") else "nobody"
        os.chown(root, pwd.getpwnam(user).pw_uid, -1)
    data, port = os.path.join(root, "data"), free_port()

    def pg(*args, check=True):
        out = subprocess.run([os.path.join(bindir, args[0]), *args[1:]], user=user, capture_output=True,
                             text=True, timeout=60)
        if check and out.returncode:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stdout[-1000:]} {out.stderr[-1000:]}")
        return out

    try:
        pg("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-N")
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
        pg("pg_ctl", "-D", data, "-l", os.path.join(root, "pg.log"), "-o", opts, "-w", "-t", "30", "start")
        yield f"postgres://postgres:postgres@127.0.0.1:{port}/postgres"
    finally:
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            pg("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
