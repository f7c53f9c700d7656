"""The control protocol of the master, the nodes and the clients: its vocabulary, its
messages and its ops, with no I/O.

- :mod:`~kvstored.protocol.enums`: roles, op names, tiers, replica states, node phases,
  per-item put outcomes, task kinds, offload failures;
- :mod:`~kvstored.protocol.shapes` and :mod:`~kvstored.protocol.messages`: how a typed
  message checks, decodes and encodes itself (``from_wire`` / ``to_wire``);
- :mod:`~kvstored.protocol.master_api` and :mod:`~kvstored.protocol.node_api`: the
  messages of the master's ops and of a node's data server;
- :mod:`~kvstored.protocol.ops`: every op once, with its role, request, reply and
  payloads (:data:`MASTER_OPS`, :data:`NODE_OPS`), and the hello.

Not here: the frame format (:mod:`kvstored.wire`), the server loop and the async caller
(:mod:`kvstored.rpc`), or what any op does.
"""

from kvstored.protocol.enums import (
    NodePhase,
    OffloadFailure,
    Op,
    PutStatus,
    ReplicaState,
    Role,
    TaskKind,
    Tier,
)
from kvstored.protocol.master_api import MAX_WAIT_SECONDS, OffloadFailed
from kvstored.protocol.messages import Message, message
from kvstored.protocol.ops import (
    HELLO,
    MASTER_OPS,
    NODE_OPS,
    PROTOCOL_VERSION,
    Hello,
    HelloReply,
    OpSpec,
)
from kvstored.protocol.shapes import MAX_BATCH

__all__ = ["HELLO", "MASTER_OPS", "MAX_BATCH", "MAX_WAIT_SECONDS", "NODE_OPS",
           "PROTOCOL_VERSION", "Hello", "HelloReply", "Message", "NodePhase", "OffloadFailed",
           "OffloadFailure", "Op", "OpSpec", "PutStatus", "ReplicaState", "Role", "TaskKind",
           "Tier", "message"]
