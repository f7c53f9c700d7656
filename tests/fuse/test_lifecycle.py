"""Mounting and unmounting: signals, fusermount3 -u, the background mode, bad input."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess

import pytest

import kvstored
from tests.daemon.harness import Daemon, free_port, kvstore, kvstore_ok, wait_for
from tests.fuse.conftest import is_mounted


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_unmounts_cleanly(cluster, mount, sig):
    m = mount("--master", cluster.addr)
    assert sorted(os.listdir(m.path)) == ["keys", "nodes", "stats"]
    assert m.unmount(sig) == 0, m.log
    assert not is_mounted(m.path)
    m.wait_log("unmounted")


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
    assert missing.returncode == 3 and b"mkdir -p" in missing.stderr  # NOT_FOUND
    stray = kvstore("mount", str(tmp_path), "--backend", "bucket")
    assert stray.returncode == 2 and b"--offline" in stray.stderr
    unreachable = kvstore("mount", str(tmp_path), "--master", "127.0.0.1:1")
    assert unreachable.returncode == 4 and b"is kvstored running?" in unreachable.stderr
    m = mount("--master", cluster.addr)
    twice = kvstore("mount", str(m.path), "--master", cluster.addr)
    assert twice.returncode == 8 and b"already mounted" in twice.stderr  # IN_USE


def test_a_mount_with_a_token_outlives_a_cluster_restart(fuse, mount, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    port = free_port()

    def start() -> Daemon:
        daemon = Daemon(["up", "--listen", f"127.0.0.1:{port}", "--data", str(tmp_path / "d"),
                         "--dram", "64MiB", "--ssd", "1GiB", "--backend", "bucket",
                         "--token-file", str(token)], cwd=tmp_path)
        daemon.wait_ready()
        return daemon

    daemon = start()
    try:
        with kvstored.connect(daemon.addr, token="s3cret") as c:
            c.put("kept", b"v" * 5000)
        kvstore_ok("flush", "--wait", "--token-file", str(token), master=daemon.addr)
        refused = kvstore("mount", str(tmp_path), "--master", daemon.addr)
        assert refused.returncode == 2 and b"token" in refused.stderr
        m = mount("--master", daemon.addr, "--token-file", str(token))
        assert (m / "keys/kept").read_bytes() == b"v" * 5000
        assert daemon.stop() == 0
        with pytest.raises(OSError) as down:
            os.listdir(m / "keys")
        assert down.value.errno == errno.EIO
        m.wait_log("cannot reach", "failed")
        daemon = start()  # the node re-registers what it has on SSD
        wait_for(lambda: os.listdir(m / "keys") == ["kept"], timeout=20,
                 what="the listing to come back")
        assert (m / "keys/kept").read_bytes() == b"v" * 5000
        assert m.proc.poll() is None
    finally:
        daemon.stop()
