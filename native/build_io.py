"""cffi build script (API mode) for ``kvstored.native._io``, the io_uring core.

setup.py lists ``native/build_io.py:ffibuilder`` in ``cffi_modules``. The script compiles
io_uring_core.c against the system liburing when a trial compile-and-link of liburing
succeeds; otherwise it compiles the same file without the uring part, so the package still
installs and the POSIX engine works. ``KVSTORED_BUILD_WITHOUT_URING=1`` forces the
POSIX-only build (to test that path). The choice is printed during the build.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
MODULE = "kvstored.native._io"
HEADER = HERE / "io_uring_core.h"
SOURCE = HERE / "io_uring_core.c"

_TRIAL = """
#include <liburing.h>
int main(void) { struct io_uring ring; return io_uring_queue_init(2, &ring, 0) == 0; }
"""


def liburing_usable() -> tuple[bool, str]:
    """Whether liburing's header and library are there to compile and link against."""
    if os.environ.get("KVSTORED_BUILD_WITHOUT_URING") == "1":
        return False, "KVSTORED_BUILD_WITHOUT_URING=1"
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    with tempfile.TemporaryDirectory(prefix="kvstored-uring-check-") as tmp:
        source = Path(tmp) / "trial.c"
        source.write_text(_TRIAL)
        try:
            trial = subprocess.run([*compiler, str(source), "-o", str(Path(tmp) / "trial"),
                                    "-luring"], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"the trial compile did not run ({exc})"
    if trial.returncode != 0:
        return False, "liburing is missing (Debian: apt install liburing-dev)"
    return True, "liburing found"


def _path(path: Path, absolute: bool) -> str:
    # setuptools insists on paths relative to setup.py's folder, the working directory
    # during a build; cffi's own compile() runs in a temporary directory and needs them
    # absolute.
    return str(path) if absolute else os.path.relpath(path)


def make_builder(module_name: str = MODULE, with_uring: bool | None = None, *,
                 absolute_paths: bool = False) -> FFI:
    """The FFI builder; ``with_uring=None`` decides by trying to link liburing.
    ``absolute_paths=True`` suits ``builder.compile()`` outside setup.py (tests)."""
    if with_uring is None:
        with_uring, why = liburing_usable()
    else:
        why = "chosen by the caller"
    print(f"kvstored: building {module_name} {'with' if with_uring else 'WITHOUT'} "
          f"io_uring ({why})", file=sys.stderr)
    builder = FFI()
    builder.cdef(HEADER.read_text())
    builder.set_source(
        module_name,
        '#include "io_uring_core.h"',
        sources=[_path(SOURCE, absolute_paths)],
        include_dirs=[_path(HERE, absolute_paths)],
        define_macros=[("KV_HAVE_URING", "1" if with_uring else "0")],
        libraries=["uring"] if with_uring else [],
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11", "-pthread"],
        extra_link_args=["-pthread"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    make_builder(absolute_paths=True).compile(verbose=True)
