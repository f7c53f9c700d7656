"""Mounting and unmounting: signals, fusermount3 -u, the background mode, bad input."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from tests.daemon.harness import kvstore, wait_for
from tests.fuse.conftest import is_mounted


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_unmounts_cleanly(cluster, mount, sig):
    m = mount("--master", cluster.addr)
    assert sorted(os.listdir(m.path)) == ["keys", "nodes", "stats"]
    assert m.unmount(sig) == 0, m.log
    assert not is_mounted(m.path)
    assert "unmounted" in m.log


def test_fusermount_u_ends_the_mount_process(cluster, mount):
    m = mount("--master", cluster.addr)
    subprocess.run(["fusermount3", "-u", str(m.path)], check=True)
    assert m.proc.wait(20) == 0, m.log
    assert not is_mounted(m.path)


def test_background_mount_returns_once_mounted(cluster, fuse, tmp_path):
    target = tmp_path / "bg"
    target.mkdir()
    run = kvstore("mount", str(target), "--master", cluster.addr, "--background")
    try:
        assert run.returncode == 0, run.stderr
        assert is_mounted(target)  # mounted before the command returned
        assert "stats" in os.listdir(target)
        pid = int(re.search(rb"by process (\d+)", run.stderr).group(1))
    finally:
        subprocess.run(["fusermount3", "-u", str(target)], check=False)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=20,
             what="the background process to exit after the unmount")
    assert not is_mounted(target)


def test_background_mount_reports_errors_to_the_caller(fuse, tmp_path):
    target = tmp_path / "bg"
    target.mkdir()
    run = kvstore("mount", str(target), "--master", "127.0.0.1:1", "--background")
    assert run.returncode == 4 and b"cannot reach 127.0.0.1:1" in run.stderr
    assert not is_mounted(target)


def test_unusable_mount_points_and_options_are_clear_errors(cluster, mount, fuse, tmp_path):
    missing = kvstore("mount", str(tmp_path / "nope"), "--master", cluster.addr)
    assert missing.returncode == 2 and b"mkdir -p" in missing.stderr
    stray = kvstore("mount", str(tmp_path), "--backend", "bucket")
    assert stray.returncode == 2 and b"--offline" in stray.stderr
    unreachable = kvstore("mount", str(tmp_path), "--master", "127.0.0.1:1")
    assert unreachable.returncode == 4 and b"is kvstored running?" in unreachable.stderr
    m = mount("--master", cluster.addr)
    twice = kvstore("mount", str(m.path), "--master", cluster.addr)
    assert twice.returncode == 2 and b"already mounted" in twice.stderr
