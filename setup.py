"""Build glue that pyproject.toml cannot express on its own.

- The package list: ``kvstored/sdk``, ``kvstored/backends``, ``kvstored/native`` and
  ``kvstored/tools`` are symbolic links to the top-level folders of those names
  (docs/architecture.md says why), and setuptools' discovery does not follow links.
- The native extensions, compiled through cffi in API mode (``cffi_modules``). Each
  build script decides for itself what the machine supports (liburing or not) and
  never fails the install for a missing optional library.
- ``kvstored.native._batch`` (native/batch.c), the one extension on the Python C API: it
  turns an io batch's Python items into requests, which cffi cannot do. It is optional:
  without it the uring engine builds its requests in Python (slower, same results).
  ``kvstored.sdk._record_check`` (sdk/record_check.c) is the other, as optional: the
  checks of a batch of records read back, in one call; ``kvstored._copy``
  (native/copy.c) a third: a copy and its CRC-32C in one pass (same-host reads).
- Leaving those build scripts out of the wheel: they read the C sources when imported,
  and a wheel carries the compiled extensions, not the sources (tests/test_packaging.py).
"""

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


def _packages() -> list[str]:
    """Every folder under kvstored/ (links followed) that holds an ``__init__.py``."""
    here = Path(__file__).parent
    found = []
    for folder, subfolders, files in os.walk(here / "kvstored", followlinks=True):
        subfolders[:] = sorted(d for d in subfolders
                               if not d.startswith((".", "_")) or d == "__pycache__")
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        if "__init__.py" in files:
            found.append(".".join(Path(folder).relative_to(here).parts))
    return found


#: The cffi build scripts, as (package, module) and as the path cffi_modules names.
BUILD_SCRIPTS = {("kvstored.native", "build_io"): "native/build_io.py",
                 ("kvstored.tools", "build_simcore"): "tools/build_simcore.py"}
# "path/to/build_script.py:ffibuilder" for every native extension.
CFFI_MODULES = [
    f"{script}:ffibuilder"
    for script in BUILD_SCRIPTS.values()
    if (Path(__file__).parent / script).exists()
]


class BuildPyWithoutBuildScripts(build_py):
    """build_py, minus the cffi build scripts (they run at build time only)."""

    def find_package_modules(self, package, package_dir):
        return [entry for entry in super().find_package_modules(package, package_dir)
                if (entry[0], entry[1]) not in BUILD_SCRIPTS]

#: The stable ABI of 3.11, the first with the buffer protocol in it (PyObject_GetBuffer).
BATCH_EXTENSION = Extension("kvstored.native._batch", sources=["native/batch.c"],
                            include_dirs=["native"], py_limited_api=True, optional=True,
                            define_macros=[("Py_LIMITED_API", "0x030B0000")],
                            extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11"])

#: The record checks of sdk/record.py in C, for a batch at a time (sdk/record_check.c);
#: optional like _batch: without it record.py checks each record in Python.
RECORD_CHECK_EXTENSION = Extension(
    "kvstored.sdk._record_check", sources=["sdk/record_check.c"], depends=["sdk/crc32c.h"],
    py_limited_api=True,
    optional=True, define_macros=[("Py_LIMITED_API", "0x030B0000")],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11"])

#: A copy and its CRC-32C in one pass, and a folding CRC-32C (native/copy.c), for the
#: data path of every role (kvstored/checksum.py), so in kvstored itself: a client must
#: not load the io engine's package for it. Optional: without it the crc32c package.
COPY_EXTENSION = Extension(
    "kvstored._copy", sources=["native/copy.c"], depends=["sdk/crc32c.h"], py_limited_api=True,
    optional=True, define_macros=[("Py_LIMITED_API", "0x030B0000")],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11"])

setup(
    packages=_packages(),
    ext_modules=[BATCH_EXTENSION, RECORD_CHECK_EXTENSION, COPY_EXTENSION],
    cffi_modules=CFFI_MODULES,
    cmdclass={"build_py": BuildPyWithoutBuildScripts},
    package_data={"kvstored": ["py.typed"],
                  "kvstored.tools": ["data/*.toml", "data/traces/*.jsonl.gz"]},
)
