"""Client libraries: :func:`connect` (blocking, thread-safe) and :mod:`kvstored.aio`."""

from kvstored.client.common import MISSING, ObjectInfo, ReplicaInfo
from kvstored.client.sync import Client, connect

__all__ = ["MISSING", "Client", "ObjectInfo", "ReplicaInfo", "connect"]
