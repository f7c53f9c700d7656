"""cffi build script (API mode) for ``kvstored.tools._simcore``, the simulator's replay core.

setup.py lists ``tools/build_simcore.py:ffibuilder`` in ``cffi_modules``. The core is
plain C99 with no library beyond libc, so it builds wherever a C compiler does. When it is
missing anyway, ``kvstored.tools.core`` says so and the simulator falls back to the
pure-Python replay (same results, much slower).
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
MODULE = "kvstored.tools._simcore"
SOURCES = ["trie.c", "replay.c", "plru.c", "optimal.c", "s3fifo.c", "tiered.c", "reuse.c",
           "intern.c"]


def _cdef(header: Path) -> str:
    # cffi parses declarations only: drop the preprocessor lines of the real header.
    lines = header.read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def _path(path: Path, absolute: bool) -> str:
    # setuptools wants paths relative to setup.py's folder (the working directory of a
    # build); cffi's own compile() runs elsewhere and needs them absolute.
    return str(path) if absolute else os.path.relpath(path)


def make_builder(module_name: str = MODULE, *, absolute_paths: bool = False) -> FFI:
    """The FFI builder. ``absolute_paths=True`` suits ``builder.compile()`` outside
    setup.py."""
    builder = FFI()
    builder.cdef(_cdef(CSRC / "simcore.h"))
    builder.set_source(
        module_name,
        '#include "simcore.h"',
        sources=[_path(CSRC / name, absolute_paths) for name in SOURCES],
        include_dirs=[_path(CSRC, absolute_paths)],
        extra_compile_args=["-O3", "-Wall", "-Wextra", "-std=gnu11"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    make_builder(absolute_paths=True).compile(verbose=True)
