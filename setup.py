"""Build glue that pyproject.toml cannot express on its own.

- The package list: the top-level folders sdk/, backends/, native/ and tools/ are
  subpackages of ``kvstored`` (see ``package-dir`` in pyproject.toml), and setuptools'
  automatic discovery does not follow such a mapping into their subfolders.
- The native extensions, compiled through cffi in API mode (``cffi_modules``). Each
  build script decides for itself what the machine supports (liburing or not) and
  never fails the install for a missing optional library.
"""

from pathlib import Path

from setuptools import setup

ROOTS = {
    "kvstored": "kvstored",
    "kvstored.sdk": "sdk",
    "kvstored.backends": "backends",
    "kvstored.native": "native",
    "kvstored.tools": "tools",
}


def _packages() -> list[str]:
    here = Path(__file__).parent
    found = []
    for name, folder in ROOTS.items():
        root = here / folder
        for init in sorted(root.rglob("__init__.py")):
            rel = init.parent.relative_to(root)
            if any(part.startswith((".", "_")) and part != "__pycache__" for part in rel.parts):
                continue
            if "__pycache__" in rel.parts:
                continue
            found.append(".".join([name, *rel.parts]) if rel.parts else name)
    return found


# "path/to/build_script.py:ffibuilder" for every native extension.
CFFI_MODULES = [
    f"{script}:ffibuilder"
    for script in ("native/build_io.py", "tools/build_simcore.py")
    if (Path(__file__).parent / script).exists()
]

setup(
    packages=_packages(),
    cffi_modules=CFFI_MODULES,
    package_data={"kvstored": ["py.typed"],
                  "kvstored.tools": ["data/*.toml", "data/traces/*.jsonl.gz"]},
)
