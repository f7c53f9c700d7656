"""Engine selection and io_uring detection: the environment, the sysctl, seccomp, and a
build without liburing. Refusals are provoked for real (in child processes), not faked."""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import logging
import os
import sys

import pytest

from kvstored.native import (
    errors,
    get_engine,
    probe_uring,
    selection,
)
from kvstored.native.probe import read_io_uring_disabled
from tests.conftest import require
from tests.native.helpers import run_python, seccomp_supported


@pytest.fixture(autouse=True)
def fresh_selection(monkeypatch):
    """Each test sees a process that has not probed, built engines or logged yet."""
    monkeypatch.setattr(selection, "_engines", {})
    monkeypatch.setattr(errors, "_logged", set())
    for name in ("KVSTORED_IO_ENGINE", "KVSTORED_IO_DIRECT"):
        monkeypatch.delenv(name, raising=False)
    selection.uring_status.cache_clear()
    yield
    selection.uring_status.cache_clear()


def test_the_environment_variable_selects_posix_even_where_uring_works(monkeypatch):
    monkeypatch.setenv("KVSTORED_IO_ENGINE", "posix")
    assert get_engine().name == "posix"


def test_the_argument_wins_over_the_environment(monkeypatch):
    require("uring", *probe_uring())
    monkeypatch.setenv("KVSTORED_IO_ENGINE", "posix")
    assert get_engine("uring").name == "uring"
    assert get_engine("POSIX ").name == "posix"


def test_auto_probes_once_and_says_what_it_picked(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="kvstored.native")
    calls = []
    real = selection.probe_uring
    monkeypatch.setattr(selection, "probe_uring", lambda: calls.append(1) or real())
    first = get_engine()
    assert get_engine("auto") is first and get_engine(queue_depth=16) is not first
    assert len(calls) == 1
    available, reason = real()
    assert first.name == ("uring" if available else "posix")
    lines = [r.getMessage() for r in caplog.records if "io engine auto" in r.getMessage()]
    assert lines == [f"io engine auto: using {first.name} ({reason})"]


def test_unknown_engine_names_are_refused_with_the_choices(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown io engine 'spdk' .*auto, uring, posix"):
        get_engine("spdk")
    monkeypatch.setenv("KVSTORED_IO_ENGINE", "aio")
    with pytest.raises(ValueError, match="KVSTORED_IO_ENGINE"):
        get_engine()


def test_kvstored_io_direct_turns_on_o_direct(monkeypatch, tmp_path):
    monkeypatch.setenv("KVSTORED_IO_DIRECT", "1")
    engine = get_engine("posix")
    assert engine.direct is True
    with engine.open(tmp_path / "f", os.O_RDWR | os.O_CREAT) as f:
        assert f.direct is True
        assert os.O_DIRECT & fcntl.fcntl(f.fd, fcntl.F_GETFL)
    with engine.open(tmp_path / "f", os.O_RDONLY, direct=False) as f:
        assert f.direct is False
    monkeypatch.setenv("KVSTORED_IO_DIRECT", "perhaps")
    with pytest.raises(ValueError, match="KVSTORED_IO_DIRECT"):
        get_engine("posix")


def test_the_probe_reads_the_sysctl_it_is_given(tmp_path):
    require("uring", *probe_uring())
    sysctl = tmp_path / "io_uring_disabled"
    sysctl.write_text("2\n")
    assert read_io_uring_disabled(sysctl) == 2
    available, reason = probe_uring(sysctl_path=sysctl)
    assert not available and "kernel.io_uring_disabled=2" in reason
    sysctl.write_text("0\n")
    assert probe_uring(sysctl_path=sysctl) == (True, "io_uring available")
    # A kernel before 6.6 has no such file: the attempt alone decides.
    assert read_io_uring_disabled(tmp_path / "absent") is None
    assert probe_uring(sysctl_path=tmp_path / "absent")[0] is True


_UNDER_SECCOMP = """
import errno, json, logging, os, tempfile
from tests.native.helpers import deny_io_uring_setup, keep_native_logs
deny_io_uring_setup(errno.{error})
logs = keep_native_logs(logging.INFO)
from kvstored.native import EngineUnavailableError, get_engine, probe_uring
out = {{"probe": probe_uring(), "probe_sysctl_1": probe_uring(sysctl_path={sysctl!r})}}
engine = get_engine()
out["auto"] = engine.name
with tempfile.TemporaryDirectory() as tmp:
    f = engine.open(os.path.join(tmp, "f"), os.O_RDWR | os.O_CREAT, direct=True)
    out["io"] = engine.write([(f, 3, b"works")]) + engine.read([(f, 3, bytearray(5))])
    streamed = [bytearray(2), bytearray(3)]
    out["stream"] = list(engine.read_stream([[(f, 3, streamed[0])], [(f, 5, streamed[1])]]))
    out["streamed"] = [bytes(b).decode() for b in streamed]
    f.close()
try:
    get_engine("uring")
except EngineUnavailableError as exc:
    out["explicit"] = str(exc)
out["logs"] = logs
print(json.dumps(out))
"""


@pytest.mark.parametrize("error", ["EPERM", "ENOSYS"])
def test_io_uring_refused_by_seccomp(error, tmp_path):
    """A seccomp filter like a container runtime's: auto falls back to posix and says why;
    asking for uring is an error that says why; both via the environment variable too."""
    require("uring", *probe_uring())  # the real module, refused at run time
    supported, why = seccomp_supported()
    if not supported:
        pytest.skip(why)
    sysctl = tmp_path / "io_uring_disabled"
    sysctl.write_text("1\n")
    out = run_python(_UNDER_SECCOMP.format(error=error, sysctl=str(sysctl)))
    available, reason = out["probe"]
    assert available is False and f"({error})" in reason
    assert out["auto"] == "posix" and out["io"] == [5, 5]
    assert out["stream"] == [[2], [3]] and out["streamed"] == ["wo", "rks"]
    assert out["logs"] == [f"io engine auto: using posix ({reason})"]
    assert "io engine 'uring' is unavailable" in out["explicit"] and reason in out["explicit"]
    if error == "EPERM":
        assert "seccomp" in reason
        assert "io_uring_group" in out["probe_sysctl_1"][1]
    else:
        assert "ENOSYS" in reason and "kernel" in reason
    via_env = run_python(
        "import json\nfrom tests.native.helpers import deny_io_uring_setup\n"
        f"import errno\ndeny_io_uring_setup(errno.{error})\n"
        "from kvstored.native import EngineUnavailableError, get_engine\n"
        "try:\n    get_engine()\n    print(json.dumps('no error'))\n"
        "except EngineUnavailableError as exc:\n    print(json.dumps(str(exc)))\n",
        env={"KVSTORED_IO_ENGINE": "uring"})
    assert "asked for by KVSTORED_IO_ENGINE" in via_env


def test_a_build_without_liburing_still_builds_and_says_so(tmp_path, monkeypatch):
    """The build script compiles the C core without its uring part (as when liburing-dev
    is missing); that module loads, refuses rings with ENOSYS, and the probe explains."""
    from kvstored.native import build_io

    monkeypatch.setenv("KVSTORED_BUILD_WITHOUT_URING", "1")
    assert build_io.liburing_usable() == (False, "KVSTORED_BUILD_WITHOUT_URING=1")
    builder = build_io.make_builder("_kvstored_io_without_uring", absolute_paths=True)
    library = builder.compile(tmpdir=str(tmp_path))
    spec = importlib.util.spec_from_file_location("_kvstored_io_without_uring", library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("_kvstored_io_without_uring", None)
    assert module.lib.kv_built_with_uring() == 0
    ring = module.ffi.new("struct kv_ring **")
    assert module.lib.kv_ring_create(8, ring) == -errno.ENOSYS
    available, reason = probe_uring(lib=module.lib)
    assert not available and "built without liburing" in reason and "liburing-dev" in reason


def test_the_build_finds_liburing_here():
    """CI installs liburing-dev: there the trial link must succeed, or the uring engine
    would silently be missing from the build."""
    from kvstored.native import build_io

    usable, why = build_io.liburing_usable()
    require("uring", usable, why)
    assert why == "liburing found"
