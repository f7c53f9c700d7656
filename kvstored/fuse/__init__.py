"""The read-only FUSE view of a store (docs/fuse.md): a live cluster's namespace, or a
backend directory opened offline. ``kvstore mount`` is its command line.

Importing the package itself needs nothing optional; the modules that talk to the kernel
import pyfuse3 (the ``fuse`` extra).
"""
