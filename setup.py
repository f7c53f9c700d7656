"""Build glue that pyproject.toml cannot express on its own.

- The package list: the top-level folders sdk/, backends/, native/ and tools/ are
  subpackages of ``kvstored`` (see ``package-dir`` in pyproject.toml), and setuptools'
  automatic discovery does not follow such a mapping into their subfolders.
- The native extensions, compiled through cffi in API mode (``cffi_modules``). Each
  build script decides for itself what the machine supports (liburing or not) and
  never fails the install for a missing optional library.
- Leaving those build scripts out of the wheel: they read the C sources when imported,
  and a wheel carries the compiled extensions, not the sources (tests/test_packaging.py).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

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

setup(
    packages=_packages(),
    cffi_modules=CFFI_MODULES,
    cmdclass={"build_py": BuildPyWithoutBuildScripts},
    package_data={"kvstored": ["py.typed"],
                  "kvstored.tools": ["data/*.toml", "data/traces/*.jsonl.gz"]},
)
