"""Client libraries: :func:`connect` (blocking, thread-safe) and :mod:`kvstored.aio`
(trio), two shells over one core (:mod:`kvstored.client.core`)."""

from kvstored.client.core import ObjectInfo
from kvstored.client.read import MISSING
from kvstored.client.sync import Client, connect
from kvstored.protocol.master_api import ReplicaInfo

__all__ = ["MISSING", "Client", "ObjectInfo", "ReplicaInfo", "connect"]
