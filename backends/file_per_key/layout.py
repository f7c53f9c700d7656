"""Where a ``file-per-key`` store keeps its files, and how an object's file is named.

Layout under the backend directory::

    KVSTORED-BACKEND.json          the stamp (backend name, layout version)
    KVSTORED-LOCK                  flock'd while the store is open (kvstored.sdk.lock)
    objects/ab/cd/<hash>.kvr       one record per object (the SDK's record format)
    tmp/                           writes in flight; emptied at a read-write open
    quarantine/                    records that check(repair=True) moved aside

``<hash>`` is the hex BLAKE2b-256 of the key's UTF-8 bytes; ``ab`` and ``cd`` are its
first two bytes. The key itself is only stored inside the record, so no key can name a
path. A file holds exactly one record: the 4 KiB header block, then the value, with no
tail padding. docs/format.md has the byte layout.
"""

from __future__ import annotations

import hashlib

LAYOUT_VERSION = 1
OBJECTS_DIR = "objects"
TMP_DIR = "tmp"
QUARANTINE_DIR = "quarantine"
SUFFIX = ".kvr"


def object_name(key_bytes: bytes) -> tuple[str, str, str]:
    """(shard, subshard, file name) of a key: the path never contains the key."""
    digest = hashlib.blake2b(key_bytes, digest_size=32).hexdigest()
    return digest[:2], digest[2:4], digest + SUFFIX
