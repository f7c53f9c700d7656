"""How a running node opens its SSD files: with O_DIRECT by default (its DRAM tier is
the cache), buffered when io.direct is off or the file system refuses O_DIRECT, and
reading the same bytes in every case."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kvstored
from tests.conftest import scratch_fs
from tests.daemon.harness import Daemon, kvstore_ok, wait_for


def _files_open(pid: int, paths: set[str]) -> dict[str, bool]:
    """Of ``paths``, those process ``pid`` holds open: whether a descriptor of each has
    O_DIRECT (from /proc/PID/fdinfo)."""
    found: dict[str, bool] = {}
    fds = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fds):
        try:
            target = os.readlink(fds / fd)
            info = (Path(f"/proc/{pid}/fdinfo") / fd).read_text()
        except OSError:  # closed meanwhile
            continue
        if target not in paths:
            continue
        flags = int(next(line.split()[1] for line in info.splitlines()
                         if line.startswith("flags:")), 8)
        found[target] = found.get(target, False) or bool(flags & os.O_DIRECT)
    return found


def _read_back_from_ssd(up: Daemon, values: dict[str, bytes]) -> set[str]:
    """Put ``values``, move them to SSD only, read them back; the files holding them."""
    with kvstored.connect(up.addr, transport="tcp") as c:
        for key, value in values.items():
            assert c.put(key, value)
        kvstore_ok("flush", "--wait", master=up.addr)
        kvstore_ok("evict", "--tier", "dram", "--all", master=up.addr)
        wait_for(lambda: all([r.tier for r in c.stat(k).replicas] == ["ssd"] for k in values),
                 timeout=15, what="the DRAM copies to go")
        assert c.batch_get(list(values)) == list(values.values())
        return {where["ssd"]["path"] for k in values for where in c.locate(k).values()}


VALUES = {f"k{i}": os.urandom(200_000 + i) for i in range(4)}


@pytest.mark.parametrize("backend", ["bucket", "offset"])
def test_a_node_reads_its_ssd_with_o_direct_by_default(embedded, tmp_path, backend):
    up = embedded("--offload", "watermark", backend=backend)
    files = _files_open(up.proc.pid, _read_back_from_ssd(up, VALUES))
    assert files and all(files.values()), files


def test_io_direct_off_opens_them_buffered(embedded, tmp_path):
    up = embedded("--offload", "watermark", backend="bucket",
                  env={"KVSTORED_IO_DIRECT": "0"})
    files = _files_open(up.proc.pid, _read_back_from_ssd(up, VALUES))
    assert files and not any(files.values()), files


def test_a_file_system_that_refuses_o_direct_is_used_buffered(embedded, tmp_path):
    with scratch_fs(tmp_path / "ramfs", kind="ramfs") as ramfs:
        up = embedded("--offload", "watermark", backend="bucket", data=ramfs / "data")
        files = _files_open(up.proc.pid, _read_back_from_ssd(up, VALUES))
        assert files and not any(files.values()), files
        warnings = [line for line in up.lines if "refuses O_DIRECT" in line]
        assert len(warnings) == 1, up.log
        up.stop()
