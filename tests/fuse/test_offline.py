"""The offline mount: a stopped store's backend directory, read without a daemon."""

from __future__ import annotations

import errno
import json
import os
from datetime import datetime

import pytest
from crc32c import crc32c

import kvstored
from kvstored.fuse.names import key_to_name
from tests.daemon.harness import Daemon, kvstore, kvstore_ok

KEYS = ["good/1", "good/2", "..", "nul\0key", "long/" * 80, "victim"]


@pytest.fixture
def stopped_store(fuse, tmp_path):
    """A `kvstored up` directory with every object flushed to SSD, the daemon stopped,
    and one record's value damaged on disk. Returns (ssd dir, values, victim's path)."""
    data = tmp_path / "data"
    daemon = Daemon(["up", "--listen", "127.0.0.1:0", "--data", str(data), "--dram", "64MiB",
                     "--ssd", "1GiB", "--backend", "bucket"], cwd=tmp_path)
    try:
        daemon.wait_ready()
        values = {k: os.urandom(5000 + 1000 * i) for i, k in enumerate(KEYS)}
        with kvstored.connect(daemon.addr) as c:
            c.batch_put(list(values), list(values.values()))
            kvstore_ok("flush", "--wait", master=daemon.addr)
            (where,) = c.locate("victim").values()
    finally:
        assert daemon.stop() == 0
    ssd = where["ssd"]
    with open(ssd["path"], "r+b") as f:  # flip one byte in the middle of the value
        f.seek(ssd["offset"] + 1234)
        byte = f.read(1)
        f.seek(ssd["offset"] + 1234)
        f.write(bytes([byte[0] ^ 0xFF]))
    return data / "ssd", values, ssd["path"]


def test_offline_mount_reads_what_the_stopped_store_holds(stopped_store, mount):
    directory, values, _ = stopped_store
    m = mount("--offline", str(directory))  # the backend comes from the directory's stamp
    assert set(os.listdir(os.fsencode(m / "keys"))) == {key_to_name(k) for k in values}
    for key, value in values.items():
        if key != "victim":
            path = m / b"keys/" + key_to_name(key)
            with open(path, "rb") as f:
                assert f.read() == value, key


def test_a_corrupt_record_reads_as_eio_never_as_bad_bytes(stopped_store, mount):
    directory, values, _ = stopped_store
    m = mount("--offline", str(directory))
    victim = m / "keys/victim"
    assert victim.stat().st_size == len(values["victim"])  # its metadata is intact
    for _ in range(2):  # and it stays unreadable
        with open(victim, "rb") as f, pytest.raises(OSError) as failed:
            f.read()
        assert failed.value.errno == errno.EIO
    m.wait_log("failed its checksum")


def test_offline_xattrs_and_backend_stats(stopped_store, mount):
    directory, values, data_file = stopped_store
    m = mount("--offline", str(directory), "--backend", "bucket")
    path = m / "keys/good%2F1"

    def attr(name: str) -> str:
        return os.getxattr(path, f"user.kvstored.{name}").decode()

    value = values["good/1"]
    assert attr("key") == "good/1" and attr("tier") == "ssd" and attr("backend") == "bucket"
    assert attr("size") == str(len(value)) and attr("checksum") == f"{crc32c(value):08x}"
    assert int(attr("seq")) > 0
    assert datetime.fromisoformat(attr("write_time")).timestamp() == pytest.approx(
        os.stat(path).st_mtime, abs=1)
    location = json.loads(attr("location"))
    with open(location["path"], "rb") as f:
        f.seek(location["offset"])
        assert f.read(location["length"]) == value
    assert location["path"] == data_file  # one bucket holds the whole flush
    stats = json.loads((m / "stats/backend.json").read_text())
    assert stats["backend"] == "bucket" and stats["usage"]["objects"] == len(values)
    assert sorted(os.listdir(m.path)) == ["keys", "stats"]
    with pytest.raises(OSError) as refused:
        os.unlink(path)
    assert refused.value.errno == errno.EROFS


def test_the_wrong_backend_is_refused_with_the_right_name(stopped_store, tmp_path, fuse):
    directory, _, _ = stopped_store
    (tmp_path / "mnt").mkdir()
    run = kvstore("mount", str(tmp_path / "mnt"), "--offline", str(directory),
                  "--backend", "file-per-key")
    assert run.returncode == 2, run.stderr
    assert b"--backend bucket" in run.stderr
