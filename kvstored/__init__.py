"""kvstored: a tiered (DRAM + NVMe SSD) KV-cache object store for LLM serving.

The installed package has one import root. Besides the daemon code in this folder it
holds:

- ``kvstored.sdk``: the storage-backend SDK and its conformance kit (folder ``sdk/``);
- ``kvstored.backends``: the built-in backends and the registry (folder ``backends/``);
- ``kvstored.native``: the io engine, io_uring through cffi or POSIX (folder ``native/``);
- ``kvstored.tools``: the hit-rate simulator and trace tools (folder ``tools/``).
"""

__version__ = "0.1.0"

__all__ = ["Client", "ObjectInfo", "__version__", "connect"]


def __getattr__(name: str):
    # The client is imported on first use, so that `import kvstored` (and the CLIs'
    # --help) stays cheap.
    if name in ("connect", "Client", "ObjectInfo"):
        from kvstored import client

        return getattr(client, name)
    raise AttributeError(f"module 'kvstored' has no attribute {name!r}")
