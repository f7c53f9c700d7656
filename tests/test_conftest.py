"""tests/conftest.py's ordering under ``make test``: the scopes holding a slow test go
out first, on xdist's workers too (where xdist sets ``--dist`` to ``no``, so the order
was silently alphabetical until the controller told its workers its mode)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _ran_order(tmp_path: Path, *dist: str) -> list[str]:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_configure_node\n")
    log = tmp_path / "order.txt"
    body = (f"import pytest\n"
            f"def _note(name):\n"
            f"    with open({str(log)!r}, 'a') as f:\n"
            f"        f.write(name + '\\n')\n")
    (tmp_path / "test_a_quick.py").write_text(
        body + "".join(f"def test_{n}():\n    _note('a{n}')\n" for n in range(3)))
    (tmp_path / "test_z_slow.py").write_text(
        body + "@pytest.mark.slow\ndef test_one():\n    _note('z')\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *dist, str(tmp_path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout + run.stderr
    return log.read_text().split()


def test_slow_scopes_go_first_on_xdist_workers(tmp_path):
    assert _ran_order(tmp_path, "-n", "1", "--dist", "loadscope",
                      "--no-loadscope-reorder") == ["z", "a0", "a1", "a2"]


def test_a_serial_run_keeps_the_collection_order(tmp_path):
    assert _ran_order(tmp_path) == ["a0", "a1", "a2", "z"]


def test_bytecode_goes_to_one_cache_outside_the_tree_when_writing_it_is_off():
    from tests.conftest import share_bytecode_cache

    environ = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin"}
    share_bytecode_cache(environ)
    assert "PYTHONDONTWRITEBYTECODE" not in environ
    assert environ["PYTHONPYCACHEPREFIX"].startswith(tempfile.gettempdir())
    assert not environ["PYTHONPYCACHEPREFIX"].startswith(str(REPO))
    chosen = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"}
    share_bytecode_cache(chosen)  # an explicit prefix is the user's choice
    assert chosen == {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"}
    writing = {"PATH": "/usr/bin"}  # bytecode is written where Python writes it
    share_bytecode_cache(writing)
    assert writing == {"PATH": "/usr/bin"}
