"""``3fs``: a backend shared by a cluster, on a 3FS mount (or any shared file system).

Modules, one concept each:

- :mod:`.backend`: :class:`ThreeFsBackend`, the StorageBackend (options in its docstring);
- :mod:`.layout`: the directory layout and file names;
- :mod:`.journal`: the per-node journal, its byte layout and its writer;
- :mod:`.index`: one node's index, built by replaying its journal, and its shards;
- :mod:`.writer`: laying out and writing a batch of records to shard files;
- :mod:`.files`: open shard handles, and verified batched reads;
- :mod:`.view`: what one node knows of the other nodes of its cluster;
- :mod:`.usrbio`: 3FS's native USRBIO I/O, wrapped as an io engine;
- :mod:`.recovery`: what happens at open;
- :mod:`.check`: check and repair.

docs/format.md ("3fs") has the byte layouts, and docs/3fs.md how a cluster shares it.
"""

from kvstored.backends.threefs.backend import SharedObject, ThreeFsBackend
from kvstored.backends.threefs.journal import JOURNAL_NAME

__all__ = ["JOURNAL_NAME", "SharedObject", "ThreeFsBackend"]
