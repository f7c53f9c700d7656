"""Both install modes give one import root, and nothing generic lands in site-packages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvstored

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = {"sdk": "sdk", "backends": "backends", "native": "native", "tools": "tools"}


def test_editable_install_maps_each_folder_under_kvstored():
    import kvstored.backends
    import kvstored.native
    import kvstored.sdk
    import kvstored.tools

    assert Path(kvstored.__file__).parent == REPO / "kvstored"
    for name, folder in SUBPACKAGES.items():
        module = sys.modules[f"kvstored.{name}"]
        assert Path(module.__file__).parent == REPO / folder, module.__file__


def _pip_install_target(source: Path, target: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True, capture_output=True, text=True, cwd=target.parent)


@pytest.mark.slow
def test_regular_install_has_one_root_and_imports(tmp_path):
    target = tmp_path / "site"
    _pip_install_target(REPO, target)
    top = {p.name for p in target.iterdir()} - {"bin", "__pycache__"}
    assert {n for n in top if not n.endswith(".dist-info")} == {"kvstored"}, top
    probe = ("import kvstored, kvstored.sdk, kvstored.backends, kvstored.native, "
             "kvstored.tools, kvstored.sdk.testing; "
             "print('\\n'.join(m.__file__ for m in (kvstored.sdk, kvstored.backends, "
             "kvstored.native, kvstored.tools)))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(target)}).stdout
    for line in out.split():
        assert line.startswith(str(target)), f"{line} was not imported from the install"


def test_console_scripts_give_useful_help():
    bindir = Path(sys.executable).parent
    for script, expected in (("kvstored", "up"), ("kvstore", "Exit codes")):
        out = subprocess.run([str(bindir / script), "--help"], check=True,
                             capture_output=True, text=True).stdout
        assert expected in out, out
    assert kvstored.__version__
