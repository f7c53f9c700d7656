import pytest

from kvstored.capabilities import (
    probe_fuse,
    probe_idle_halts,
    probe_rdma,
    required_capabilities,
)
from tests.conftest import require


def test_required_capabilities_parses_the_list():
    assert required_capabilities({"KVSTORED_REQUIRE": "fuse, uring"}) == {"fuse", "uring"}
    assert required_capabilities({}) == set()


def test_required_capabilities_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown capabilities"):
        required_capabilities({"KVSTORED_REQUIRE": "fuse,warp-drive"})


def test_require_fails_instead_of_skipping_when_required(monkeypatch):
    monkeypatch.setenv("KVSTORED_REQUIRE", "fuse")
    with pytest.raises(pytest.fail.Exception, match="required"):
        require("fuse", False, "test")


def test_require_skips_when_not_required(monkeypatch):
    monkeypatch.delenv("KVSTORED_REQUIRE", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require("fuse", False, "test")


def test_fuse_probe_reports_a_reason():
    available, reason = probe_fuse()
    assert isinstance(available, bool) and reason
    require("fuse", available, reason)


def test_rdma_probe_detects_absence_here(tmp_path, monkeypatch):
    available, reason = probe_rdma()
    assert isinstance(available, bool) and reason
    if not available:
        assert "RDMA" in reason or "rdma" in reason


def test_engine_probe_names_the_install_script_when_absent():
    from kvstored.capabilities import probe_engine

    available, reason = probe_engine("no-such-engine")
    assert not available and ".ci/engines" in reason
    assert required_capabilities({"KVSTORED_REQUIRE": "fuse,engines"}) == {"fuse", "engines"}


def test_fio_probe_finds_fio_on_path_and_names_the_package_without_it(monkeypatch, tmp_path):
    from kvstored.capabilities import probe_fio

    monkeypatch.setenv("PATH", str(tmp_path))
    available, reason = probe_fio()
    assert not available and "Debian package fio" in reason
    fake = tmp_path / "fio"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert probe_fio() == (True, f"fio at {fake}")
    assert required_capabilities({"KVSTORED_REQUIRE": "fio"}) == {"fio"}


def _machine(root, *, vm: bool, driver: str | None = None, poll_ns: str | None = None):
    (root / "proc").mkdir(parents=True)
    flags = "fpu sse2 hypervisor" if vm else "fpu sse2"
    (root / "proc/cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    if driver is not None:
        (root / "sys/devices/system/cpu/cpuidle").mkdir(parents=True)
        (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text(driver + "\n")
    if poll_ns is not None:
        (root / "sys/module/haltpoll/parameters").mkdir(parents=True)
        (root / "sys/module/haltpoll/parameters/guest_halt_poll_ns").write_text(poll_ns)
    return str(root)


@pytest.mark.parametrize(("machine", "halts"), [
    ({"vm": False, "driver": "intel_idle"}, False),
    ({"vm": True, "driver": "haltpoll", "poll_ns": "200000"}, False),
    ({"vm": True, "driver": "haltpoll", "poll_ns": "0"}, True),
    ({"vm": True, "driver": "acpi_idle"}, True),
    ({"vm": True}, True),  # no cpuidle at all: the idle loop halts
])
def test_idle_halts_probe_tells_vms_whose_idle_vcpus_halt_at_once(tmp_path, machine, halts):
    found, reason = probe_idle_halts(_machine(tmp_path, **machine))
    assert found is halts and reason

