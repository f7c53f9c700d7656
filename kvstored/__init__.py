"""kvstored: a tiered (DRAM + NVMe SSD) KV-cache object store for LLM serving.

The installed package has one import root. Besides the daemon code in this folder it
holds:

- ``kvstored.sdk``: the storage-backend SDK and its conformance kit (folder ``sdk/``);
- ``kvstored.backends``: the built-in backends and the registry (folder ``backends/``);
- ``kvstored.native``: the io engine, io_uring through cffi or POSIX (folder ``native/``);
- ``kvstored.tools``: the hit-rate simulator and trace tools (folder ``tools/``).
"""

__version__ = "0.1.0"
