"""Storage faults, with real processes: the offline tools against live, empty, mistyped and
data directories (issue 9 item 4); damaged volumes (11), stamps (12) and bucket indexes
(21); who can read the files (15); a disk too small (17); reopening in a loop (24).

The stores are written by real `kvstored up` processes where the daemon matters, and by a
child process using the backend API where the test needs to control the layout exactly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import kvstored
import kvstored.native
from kvstored.backends.stamp import STAMP_NAME
from kvstored.capabilities import probe_fuse
from kvstored.sdk import CapacityError, OpenMode, RepairAction
from kvstored.sdk.lock import LOCK_NAME
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import payload
from tests.conftest import require, scratch_fs
from tests.daemon.harness import BIN, Daemon, kvstore, kvstore_ok

MiB = 1 << 20


# -- helpers ---------------------------------------------------------------------------------


def tree(root: Path) -> dict[str, tuple]:
    """What a write would change under ``root``: per entry its mode, size, inode, mtime,
    ctime, and a digest of a file's bytes."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            st = path.lstat()
            digest = (hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
                      if stat.S_ISREG(st.st_mode) else None)
            found[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_ino,
                                                  st.st_mtime_ns, st.st_ctime_ns, digest)
    return found


def one_line_error(run: subprocess.CompletedProcess) -> str:
    """The tool's error: exactly one line on stderr, no traceback."""
    err = run.stderr.decode()
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def up(data: Path, *extra: str, backend: str = "bucket", ssd: str = "256MiB") -> Daemon:
    return Daemon(["up", "--listen", "127.0.0.1:0", "--data", str(data), "--dram", "32MiB",
                   "--ssd", ssd, "--backend", backend, *extra], cwd=data.parent)


def assert_refuses_to_start(daemon: Daemon, what: str) -> None:
    """The daemon must exit by itself (it refused); one that serves is stopped, then fails
    the test, so that a daemon that wrongly starts is never left running."""
    try:
        daemon.proc.wait(60)
    except subprocess.TimeoutExpired:
        daemon.stop()
        raise AssertionError(f"kvstored started {what}:\n{daemon.log}") from None
    daemon.stop()
    assert daemon.proc.returncode != 0, daemon.log


def store_with_objects(data: Path, values: dict[str, bytes], *, backend: str = "bucket",
                       ssd: str = "256MiB") -> None:
    """A stopped `kvstored up` store whose objects are all on SSD."""
    daemon = up(data, backend=backend, ssd=ssd)
    try:
        daemon.wait_ready()
        with kvstored.connect(daemon.addr) as client:
            client.batch_put(list(values), list(values.values()))
        kvstore_ok("flush", "--wait", master=daemon.addr)
    finally:
        assert daemon.stop() == 0, daemon.log


@pytest.fixture(scope="module")
def stopped_store(tmp_path_factory):
    """``copy(data, values, ...)`` puts at ``data`` a copy of a stopped `kvstored up` store
    like :func:`store_with_objects` makes. A real daemon writes each kind of store once per
    module; the tests that damage a store each damage a copy of their own."""
    written: dict[tuple, Path] = {}

    def copy(data: Path, values: dict[str, bytes], *, backend: str = "bucket",
             ssd: str = "256MiB") -> None:
        kind = (tuple(values.items()), backend, ssd)
        if kind not in written:
            written[kind] = tmp_path_factory.mktemp("store") / "data"
            store_with_objects(written[kind], values, backend=backend, ssd=ssd)
        shutil.copytree(written[kind], data, symlinks=True)

    return copy


def read_back(data: Path, values: dict[str, bytes], *, backend: str = "bucket",
              ssd: str = "256MiB") -> dict[str, bytes | None]:
    """Start `kvstored up` on ``data`` and get every key (None for a miss)."""
    daemon = up(data, backend=backend, ssd=ssd)
    try:
        daemon.wait_ready()
        with kvstored.connect(daemon.addr) as client:
            return {key: client.get(key) for key in values}
    finally:
        assert daemon.stop() == 0, daemon.log


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=300)


def values_for(prefix: str, count: int, size: int = 9000) -> dict[str, bytes]:
    return {f"{prefix}/{i}": payload(f"{prefix}/{i}", size + i) for i in range(count)}


@pytest.fixture
def fuse():
    require("fuse", *probe_fuse())


@pytest.fixture
def offline_mount(fuse, tmp_path):
    """Run `kvstore mount MNT --offline DIR --background` and return the finished process;
    whatever it mounted (it should not have) is unmounted after the test, so a tool that
    wrongly mounts cannot hang the run or leave a mount behind."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()

    def run(directory: Path) -> subprocess.CompletedProcess:
        return kvstore("mount", str(mountpoint), "--offline", str(directory),
                       "--background", timeout=60)

    yield run
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)


# -- item 4: the offline tools write nothing and refuse what is not theirs -------------------


def test_offline_tools_refuse_a_directory_a_live_node_holds(tmp_path, offline_mount):
    data = tmp_path / "data"
    daemon = up(data)
    try:
        daemon.wait_ready()
        with kvstored.connect(daemon.addr) as client:
            client.batch_put(["held"], [b"by a live node"])
        kvstore_ok("flush", "--wait", master=daemon.addr)
        before = tree(data / "ssd")
        run = kvstore("recover", "--offline", str(data / "ssd"))
        assert run.returncode == 8, run  # IN_USE
        line = one_line_error(run)
        assert f"pid {daemon.proc.pid}" in line and "kvstored up" in line, line
        run = offline_mount(data / "ssd")
        assert run.returncode == 8, run
        assert f"pid {daemon.proc.pid}" in run.stderr.decode()
        assert not os.path.ismount(tmp_path / "mnt")
        assert tree(data / "ssd") == before, "a refused offline tool changed the directory"
    finally:
        assert daemon.stop() == 0, daemon.log
    assert "1 objects read back and verified" in kvstore_ok("recover", "--offline",
                                                            str(data / "ssd"))


@pytest.mark.parametrize("tool", ["recover", "mount"])
def test_offline_tools_refuse_an_empty_directory(tmp_path, tool, offline_mount):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = (kvstore("recover", "--offline", str(empty)) if tool == "recover"
           else offline_mount(empty))
    assert run.returncode == 3, run
    line = one_line_error(run)
    assert STAMP_NAME in line and "empty" in line, line
    assert os.listdir(empty) == [], "the refused tool created something"


@pytest.mark.parametrize("tool", ["recover", "mount"])
def test_offline_tools_refuse_a_mistyped_directory(tmp_path, tool, offline_mount):
    typo = tmp_path / "dta" / "ssd"
    run = (kvstore("recover", "--offline", str(typo)) if tool == "recover"
           else offline_mount(typo))
    assert run.returncode == 3, run
    assert "does not exist" in one_line_error(run)
    assert not (tmp_path / "dta").exists(), "the refused tool created the directory"


def test_offline_tools_name_the_ssd_folder_of_a_data_directory(tmp_path, offline_mount):
    data = tmp_path / "data"
    store_with_objects(data, {"k": b"v"})
    before = tree(data)
    for run in (kvstore("recover", "--offline", str(data)), offline_mount(data)):
        assert run.returncode == 3, run
        line = one_line_error(run)
        assert "data directory" in line and f"pass {data / 'ssd'}" in line, line
    assert tree(data) == before


def crash_a_bucket_writer(store: Path) -> None:
    """Run a bucket writer on ``store`` and kill -9 it in the middle of a bucket write:
    once its 21st bucket's data file exists (its index comes last)."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from kvstored.sdk.registry import open_backend
        backend = open_backend("bucket", sys.argv[1], bucket_keys=4)
        n = 0
        while True:
            backend.batch_write([(f"c/{n}/{i}", bytes([i]) * 200_000) for i in range(4)])
            print(n, flush=True)
            n += 1
    """), str(store)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(20):
            child.stdout.readline()
        data_21 = store / "buckets" / f"{21:016x}.data"
        deadline = time.monotonic() + 30
        while not data_21.exists() and time.monotonic() < deadline:
            time.sleep(0.0005)  # polling for the file, with a deadline
    finally:
        child.kill()
        child.wait()


def test_offline_recover_of_a_crashed_store_writes_nothing(tmp_path):
    """A writer killed in the middle of its batches leaves leftovers that a read-write open
    would remove: `recover --offline` reports each once, as left for that open, exits 0,
    and leaves every byte as it was."""
    for attempt in range(10):  # until the kill lands inside a bucket write
        store = tmp_path / f"ssd{attempt}"
        crash_a_bucket_writer(store)
        names = os.listdir(store / "buckets")
        ids = {n.split(".")[0] for n in names if n.endswith(".idx")}
        leftovers = [n for n in names if n.endswith(".tmp")
                     or (n.endswith(".data") and n.split(".")[0] not in ids)]
        if leftovers:
            break
    else:
        raise AssertionError("ten kills all landed after a bucket write had finished")
    before = tree(store)
    run = kvstore("recover", "--offline", str(store), "--json")
    assert run.returncode == 0, run
    import json

    problems = json.loads(run.stdout)["problems"]
    assert sorted(Path(p["path"]).name for p in problems) == sorted(leftovers), problems
    assert all(p["action"] == RepairAction.LEFT_FOR_NEXT_OPEN.value for p in problems)
    assert tree(store) == before, "recover --offline (read-only) changed the directory"
    assert not (store / "quarantine").exists()


# -- item 11: a volume that does not read is never formatted over --------------------------


def flip_superblock_magic(volume: Path) -> None:
    with open(volume, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0x01]))


def garbage_first_mib(volume: Path) -> None:
    with open(volume, "r+b") as f:
        f.write(os.urandom(MiB))


@pytest.mark.parametrize("damage", [flip_superblock_magic, garbage_first_mib])
def test_damaged_offset_volume_is_refused_then_rebuilt(tmp_path, stopped_store, damage):
    data = tmp_path / "data"
    values = values_for("o", 40, 60_000)  # 2.5 MiB of records: past the first MiB
    stopped_store(data, values, backend="offset", ssd="16MiB")
    volume = data / "ssd" / "volume.kvo"
    with open_backend("offset", data / "ssd", mode=OpenMode.READ_ONLY) as backend:
        beyond = {k for k in values if backend.locate(k).record_offset >= MiB}
    damage(volume)
    damaged = tree(data / "ssd")

    daemon = up(data, backend="offset", ssd="16MiB")
    assert_refuses_to_start(daemon, "on a volume it cannot read")
    assert "recover --offline" in daemon.log and str(volume) in daemon.log, daemon.log
    assert tree(data / "ssd") == damaged, "the daemon changed the damaged volume"

    run = kvstore("recover", "--offline", str(data / "ssd"))
    assert run.returncode == 5, run
    line = one_line_error(run)
    assert "never formats" in line and "--repair" in line, line
    assert tree(data / "ssd") == damaged, "recover --offline changed the damaged volume"

    run = kvstore("recover", "--offline", str(data / "ssd"), "--repair")
    assert run.returncode == 0, run
    report = run.stdout.decode()
    assert "rebuilt" in report, report
    assert list((data / "ssd" / "quarantine").glob("*-volume.kvo-head.kvr")), \
        "the damaged metadata was not kept"
    got = read_back(data, values, backend="offset", ssd="16MiB")
    if damage is flip_superblock_magic:  # the checkpoints identify the volume: nothing lost
        assert got == values
    else:  # the first MiB is gone; every record after it comes back
        assert beyond and all(got[k] == values[k] for k in beyond), sorted(beyond - {
            k for k in beyond if got[k] == values[k]})
        assert all(got[k] in (values[k], None) for k in values)


def test_nvmeof_device_with_a_lost_superblock_is_refused_then_rebuilt(tmp_path):
    from tests.backends.test_nvmeof_conformance import loop_attached

    with loop_attached(tmp_path / "loop.img") as device:
        backend = open_backend("nvmeof", tmp_path / "ssd", device=device)
        items = [(f"d{i}", payload(f"d{i}", 7000)) for i in range(30)]
        assert all(r.ok for r in backend.batch_write(items))
        backend.close()
        flip_superblock_magic(Path(device))
        with open(device, "rb") as f:
            before = f.read(2 * MiB)
        run = kvstore("recover", "--offline", str(tmp_path / "ssd"))  # finds the device
        assert run.returncode == 5, run
        assert "never formats" in one_line_error(run)
        with pytest.raises(kvstored.sdk.CorruptionError, match="never formats"):
            open_backend("nvmeof", tmp_path / "ssd", device=device)
        with open(device, "rb") as f:
            assert f.read(2 * MiB) == before, "a refused open wrote to the device"
        backend = open_backend("nvmeof", tmp_path / "ssd", device=device,
                               mode=OpenMode.REPAIR)
        assert all(backend.read(k) == v for k, v in items)
        assert any(p.action is RepairAction.REBUILT
                   and "from the checkpoint slots" in (p.action_detail or "")
                   for p in backend.check().problems)
        backend.close()
        open_backend("nvmeof", tmp_path / "ssd", device=device).close()


# -- item 12: a damaged or missing stamp -----------------------------------------------------


def not_utf8(stamp: Path) -> None:
    stamp.write_bytes(b'{"backend": "\xff\xfe", "layout": 1}')


def garbage(stamp: Path) -> None:
    stamp.write_bytes(os.urandom(64).replace(b"{", b"x"))


def truncated(stamp: Path) -> None:
    stamp.write_bytes(stamp.read_bytes()[:15])


def deleted(stamp: Path) -> None:
    stamp.unlink()


@pytest.mark.parametrize("damage", [not_utf8, garbage, truncated, deleted])
def test_damaged_stamp_is_one_line_exit_5_and_repair_rebuilds_it(tmp_path, stopped_store,
                                                                 damage):
    data = tmp_path / "data"
    values = values_for("s", 12)
    stopped_store(data, values)
    stamp = data / "ssd" / STAMP_NAME
    damage(stamp)
    damaged = tree(data / "ssd")

    run = kvstore("recover", "--offline", str(data / "ssd"))
    assert run.returncode == 5, run
    line = one_line_error(run)
    assert STAMP_NAME in line and "--repair" in line, line
    assert tree(data / "ssd") == damaged

    daemon = up(data)
    assert_refuses_to_start(daemon, "without a readable stamp")
    assert STAMP_NAME in daemon.log, daemon.log
    assert tree(data / "ssd") == damaged, "the daemon overwrote or created the stamp"

    run = kvstore("recover", "--offline", str(data / "ssd"), "--repair")
    assert run.returncode == 0, run
    assert '"backend": "bucket"' in stamp.read_text()
    assert read_back(data, values) == values


# -- item 21: one flipped bit in a bucket index ---------------------------------------------


def test_flipped_bit_in_a_bucket_index_loses_no_object(tmp_path, fuse):
    store = tmp_path / "ssd"
    values = values_for("b", 500, 2000)
    written = run_python("""
        import sys
        from kvstored.sdk.registry import open_backend
        from kvstored.sdk.testing import payload
        backend = open_backend("bucket", sys.argv[1])
        items = [(f"b/{i}", payload(f"b/{i}", 2000 + i)) for i in range(500)]
        assert all(r.ok for r in backend.batch_write(items))
        backend.close()
    """, str(store))
    assert written.returncode == 0, written.stderr
    [index] = list((store / "buckets").glob("*.idx"))
    with open(index, "r+b") as f:
        f.seek(40 + 37 * 40 + 20)  # a bit of entry 37's seq
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))

    run = kvstore("recover", "--offline", str(store), "--json")
    assert run.returncode == 5, run  # read-only: the damage is found and left
    import json

    report = json.loads(run.stdout)
    assert report["objects"] == 500, report
    [problem] = report["problems"]
    assert "500 record(s) that verify" in problem["detail"] and problem["action"] is None

    m = tmp_path / "mnt"
    mount = subprocess.Popen([str(BIN / "kvstore"), "mount", str(m), "--offline", str(store)],
                             stderr=subprocess.PIPE, text=True)
    m.mkdir()
    try:
        for line in mount.stderr:
            if "mounted read-only" in line:
                break
        assert len(os.listdir(m / "keys")) == 500
        with open(m / "keys" / "b%2F37", "rb") as f:
            assert f.read() == values["b/37"]
    finally:
        subprocess.run(["fusermount3", "-u", str(m)], check=False)
        mount.wait(30)

    run = kvstore("recover", "--offline", str(store), "--repair")
    assert run.returncode == 0, run
    assert "-> rebuilt: from the records of its data file" in run.stdout.decode()
    assert list((store / "quarantine").glob(f"*-{index.name}")), "the bad index was not kept"
    with open_backend("bucket", store) as backend:
        assert all(backend.read(k) == v for k, v in values.items())
        assert not backend.check().problems


# -- item 15: data at rest is private -------------------------------------------------------


@pytest.fixture
def shared_tmp():
    """A directory others may traverse (pytest's own is 0700, which would hide the files
    whatever their modes), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("reading as another uid needs root and setpriv")
    path = Path(tempfile.mkdtemp(prefix="kvstored-privacy-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           *command], capture_output=True, timeout=30)


@pytest.mark.parametrize("backend", ["bucket", "file-per-key", "offset", "3fs"])
def test_another_user_cannot_read_the_ssd_tier(shared_tmp, backend):
    control = shared_tmp / "control"
    control.write_bytes(b"readable")
    control.chmod(0o644)
    assert as_nobody("cat", str(control)).stdout == b"readable", "setpriv does not work here"

    data = shared_tmp / "data"
    values = values_for("p", 8)
    store_with_objects(data, values, backend=backend,
                       ssd="16MiB" if backend == "offset" else "256MiB")
    with open_backend(backend, data / "ssd", mode=OpenMode.READ_WRITE) as opened:
        where = opened.locate("p/3") or next(iter(opened.scan())).location
        bad = opened.check(repair=False)
    assert not bad.problems
    files = [Path(p) / n for p, _, names in os.walk(data / "ssd") for n in names]
    dirs = [Path(p) / n for p, names, _ in os.walk(data) for n in names] + [data]
    assert files and dirs
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path} is {path.stat().st_mode:o}"
        assert as_nobody("cat", str(path)).returncode != 0, f"another user read {path}"
    for path in dirs:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, f"{path} is {path.stat().st_mode:o}"
    assert as_nobody("cat", where.path).returncode != 0


def test_an_old_world_readable_store_is_made_private_at_open(shared_tmp):
    store = shared_tmp / "ssd"
    with open_backend("bucket", store) as backend:
        assert all(r.ok for r in backend.batch_write([("k", b"secret")]))
        path = backend.locate("k").path
    for folder, _, names in os.walk(store):  # as stores were before they were private
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)
    assert as_nobody("cat", path).returncode == 0
    open_backend("bucket", store).close()
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert as_nobody("cat", path).returncode != 0


def test_quarantined_records_are_private(shared_tmp):
    store = shared_tmp / "ssd"
    with open_backend("bucket", store) as backend:
        assert all(r.ok for r in backend.batch_write([("k", payload("k", 9000))]))
        where = backend.locate("k")
        with open(where.path, "r+b") as f:
            f.seek(where.offset + 100)
            f.write(b"\0\1\2")
        assert backend.check(repair=True).ok
    copies = list((store / "quarantine").iterdir())
    assert len(copies) == 2  # the record and its note
    for path in copies:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((store / "quarantine").stat().st_mode) == 0o700


# -- item 17: a volume that does not fit -------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    """An 8 MiB tmpfs: a disk too small for a 64 MiB volume."""
    with scratch_fs(tmp_path / "small", "8m") as where:
        yield where


def test_offset_volume_larger_than_the_disk_is_a_clean_capacity_error(small_tmpfs):
    store = small_tmpfs / "ssd"
    with pytest.raises(CapacityError) as refused:
        open_backend("offset", store, capacity=64 * MiB)
    message = str(refused.value)
    assert "64.0 MiB" in message and "free" in message and "volume.kvo" in message, message
    assert not list(store.glob("*volume*")), "a partial volume was left behind"
    daemon = up(small_tmpfs / "data", backend="offset", ssd="64MiB")
    assert_refuses_to_start(daemon, "with a volume larger than its disk")
    assert "64.0 MiB" in daemon.log and "free" in daemon.log, daemon.log


# -- item 24: a volume reopened in the same process --------------------------------------------


def fd_locks() -> dict[int, str]:
    """This process's descriptors that hold a lock, from /proc/self/fdinfo."""
    found = {}
    for name in os.listdir("/proc/self/fdinfo"):
        try:
            with open(f"/proc/self/fdinfo/{name}") as f:
                info = f.read()
        except OSError:
            continue
        if "lock:" in info:
            found[int(name)] = info.split("lock:", 1)[1].strip()
    return found


@pytest.mark.parametrize("engine", ["posix", "uring"])
@pytest.mark.parametrize("backend", ["nvmeof", "offset"])
def test_reopen_200_times_in_a_row(tmp_path, backend, engine):
    if engine == "uring":
        require("uring", *kvstored.native.uring_status())
    path = tmp_path / ("volume" if backend == "nvmeof" else "ssd")
    options = {"engine": engine, "capacity": 8 * MiB, "checkpoint_bytes": 1 << 40}
    for n in range(200):
        store = open_backend(backend, path, **options)
        if n == 0:  # the lock is on a descriptor of its own, never the io engine's
            locks = {fd: info for fd, info in fd_locks().items() if "FLOCK" in info}
            assert store.volume_file.fd not in locks and locks, locks
        # A write, then the closing checkpoint's write and fsync: what held the file.
        assert store.write(f"k{n}", payload(f"k{n}", 3000)).ok
        assert store.read(f"k{max(0, n - 1)}") == payload(f"k{max(0, n - 1)}", 3000)
        store.close()
    lock = path if backend == "nvmeof" else path / LOCK_NAME
    child = run_python("""
        import fcntl, os, sys
        fd = os.open(sys.argv[1], os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    """, str(lock))
    assert child.returncode == 0, f"the lock outlived close(): {child.stderr}"
