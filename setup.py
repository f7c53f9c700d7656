"""Build glue that pyproject.toml cannot express on its own.

- The package list: the top-level folders sdk/, backends/, native/ and tools/ are
  subpackages of ``kvstored`` (see ``package-dir`` in pyproject.toml), and setuptools'
  automatic discovery does not follow such a mapping into their subfolders.
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


setup(
    packages=_packages(),
    package_data={"kvstored": ["py.typed"], "kvstored.tools": ["data/*.toml"]},
)
