"""Block keys as an engine builds them: each block's key hashes its parent's key with its
own id, so a key names the whole prefix up to and including its block.

This is the rule of SGLang HiCache and LMCache (a chained hash over the token blocks),
and it is what makes ``prefix_hits`` meaningful: two requests share a key exactly when
they share the prefix up to it. It is also the simulator's prefix trie (a node is a
``(parent, id)`` pair, ``kvstored.tools.core.build_trie``), so the store and the
prediction see the same blocks.

A key is ``NAMESPACE/HEX``: the namespace keeps one replay's blocks apart from anything
else in the store (and lets ``kvstore ls``/``evict --prefix`` find them); HEX is 24
hex digits (96 bits) of BLAKE2b.

This module names blocks; it does not make their values (``values``) or talk to a store.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np

#: Bytes of the chained digest (96 bits: collisions are out of reach for any trace).
DIGEST_BYTES = 12


def new_namespace() -> str:
    """A fresh namespace for one replay: ``replay-`` and 8 random hex digits."""
    return f"replay-{secrets.token_hex(4)}"


def check_namespace(namespace: str) -> str:
    """``namespace`` if usable as a key prefix, else ValueError saying why."""
    if not namespace or "/" in namespace or not namespace.isprintable() \
            or len(namespace.encode()) > 200:
        raise ValueError(f"the namespace must be 1-200 printable bytes without '/', "
                         f"not {namespace!r}")
    return namespace


def chained_keys(namespace: str, ids: np.ndarray) -> list[str]:
    """The keys of one request's blocks, whose ids are ``ids`` (int64), in order."""
    out = []
    parent = hashlib.blake2b(namespace.encode(), digest_size=DIGEST_BYTES).digest()
    prefix = namespace + "/"
    for block_id in ids.tolist():
        digest = hashlib.blake2b(parent + block_id.to_bytes(8, "little", signed=True),
                                 digest_size=DIGEST_BYTES).digest()
        out.append(prefix + digest.hex())
        parent = digest
    return out
