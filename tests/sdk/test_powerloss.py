"""The power-loss file system keeps exactly what was made durable, and the kit's power
checks catch backends that skip a sync (tests/sdk/power_broken_backends.py)."""

from __future__ import annotations

import os
import stat

import pytest

from kvstored.native import get_engine
from kvstored.sdk.testing import run_kit
from kvstored.sdk.testing.powerfs import PAGE, ROOT_INODE, Model
from tests.sdk.conftest import passed_by_broken, require_engine, require_fuse

MODULE = "tests.sdk.power_broken_backends"
POWER_CHECKS = {"power_cut_keeps_acknowledged", "power_cut_tears_nothing",
                "power_cut_after_create"}


def why_not_applicable(outcome) -> str | None:
    """Why the kit reported ``outcome`` not applicable, or None if the check ran."""
    return outcome.not_applicable


def why_not_applicable_in_json(entry: dict) -> str | None:
    """The same for one check of the kit's ``--json`` report."""
    return entry["not_applicable"]


# -- the model alone ---------------------------------------------------------------------


def _file(model: Model, directory: int, name: bytes):
    node = model.new_node(stat.S_IFREG | 0o600, 0, 0)
    model.node(directory).set_entry(name, node.ino)
    return node


def test_synced_file_in_synced_directory_survives():
    model = Model()
    node = _file(model, ROOT_INODE, b"f")
    node.write(0, b"x" * 5000)
    node.sync_data()
    model.node(ROOT_INODE).sync_entries()
    node.write(5000, b"unsynced")
    model.cut(0.0, seed=1)
    survivor = model.node(model.node(ROOT_INODE).entries[b"f"])
    assert survivor.read(0, 10_000) == b"x" * 5000


def test_a_name_whose_directory_was_not_synced_is_lost():
    model = Model()
    node = _file(model, ROOT_INODE, b"f")
    node.write(0, b"data")
    node.sync_data()  # the data, but not the name
    model.cut(0.0, seed=1)
    assert model.node(ROOT_INODE).entries == {}
    assert node.ino not in model.nodes


def test_unlink_without_directory_sync_comes_back():
    model = Model()
    root = model.node(ROOT_INODE)
    node = _file(model, ROOT_INODE, b"f")
    node.write(0, b"data")
    node.sync_data()
    root.sync_entries()
    root.set_entry(b"f", None)
    model.cut(0.0, seed=1)
    assert model.node(root.entries[b"f"]).read(0, 4) == b"data"


def test_rename_is_durable_per_directory():
    """Only the target directory synced: the file is under both names; only the source
    synced: it is under neither."""
    for synced, expected in (("target", {b"a": True, b"b": True}),
                             ("source", {b"a": False, b"b": False})):
        model = Model()
        root = model.node(ROOT_INODE)
        src = model.new_node(stat.S_IFDIR | 0o700, 0, 0)
        dst = model.new_node(stat.S_IFDIR | 0o700, 0, 0)
        root.set_entry(b"src", src.ino)
        root.set_entry(b"dst", dst.ino)
        root.sync_entries()
        node = _file(model, src.ino, b"a")
        node.sync_data()
        src.sync_entries()
        src.set_entry(b"a", None)
        dst.set_entry(b"b", node.ino)
        (dst if synced == "target" else src).sync_entries()
        model.cut(0.0, seed=1)
        assert {b"a": b"a" in model.node(src.ino).entries,
                b"b": b"b" in model.node(dst.ino).entries} == expected, synced


def test_partial_survival_is_seeded_and_page_grained():
    def run(seed: int) -> bytes:
        model = Model()
        node = _file(model, ROOT_INODE, b"f")
        node.sync_data()
        model.node(ROOT_INODE).sync_entries()
        node.write(0, b"\x01" * (64 * PAGE))
        model.cut(0.5, seed)
        return model.node(node.ino).read(0, 64 * PAGE)

    first = run(7)
    assert first == run(7), "the same seed must lose the same pages"
    pages = {first[i:i + PAGE] for i in range(0, len(first), PAGE)}
    assert pages <= {b"\x01" * PAGE, b"\0" * PAGE}, "a page survives whole or not at all"
    survivors = [run(seed) for seed in range(20)]
    assert any(len(s) == 64 * PAGE and s.count(0) for s in survivors), \
        "with survival 0.5 some cut must keep the size and tear the data"


def test_bytes_past_a_lost_size_do_not_come_back():
    """A page that reached the disk while the size that covered it did not: when the
    file grows again those bytes read as zeros, as on a real file system."""
    model = Model()
    node = _file(model, ROOT_INODE, b"f")
    node.write(0, b"a" * 100)
    node.sync_data()
    model.node(ROOT_INODE).sync_entries()
    node.write(100, b"b" * 100)
    node.durable_pages[0] = node.pages[0]  # the page reached the disk, the size did not
    node.dirty.clear()
    model.cut(0.0, seed=1)
    survivor = model.node(node.ino)
    assert survivor.size == 100
    survivor.truncate(200)
    assert survivor.read(0, 200) == b"a" * 100 + bytes(100)


def test_truncate_then_sync_forgets_the_tail():
    model = Model()
    node = _file(model, ROOT_INODE, b"f")
    node.write(0, bytes(range(256)) * 40)
    node.truncate(100)
    node.write(200, b"z")
    node.sync_data()
    assert node.read(0, 300) == bytes(range(100)) + bytes(100) + b"z"


# -- the mounted file system -------------------------------------------------------------


def _fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_mount_keeps_only_what_was_synced(mount):
    root = mount.mountpoint
    os.mkdir(root / "d")
    _fsync_dir(root)
    with open(root / "d" / "synced", "wb") as f:
        f.write(b"kept")
        f.flush()
        os.fsync(f.fileno())
    with open(root / "d" / "unsynced", "wb") as f:
        f.write(b"lost")
    _fsync_dir(root / "d")
    with open(root / "d" / "synced", "ab") as f:
        f.write(b" and lost")
    (root / "d" / "late").write_bytes(b"never named durably")
    counters = mount.cut(0.0, seed=1)
    with pytest.raises(OSError):
        os.listdir(root / "d")  # the power is off
    mount.power_on()
    assert sorted(os.listdir(root / "d")) == ["synced", "unsynced"]
    assert (root / "d" / "synced").read_bytes() == b"kept"
    assert (root / "d" / "unsynced").read_bytes() == b"", "its data was never fsync'd"
    assert counters["cuts"] == 1 and counters["lost_inodes"] == 1


def test_o_dsync_writes_are_durable_when_they_return(mount):
    root = mount.mountpoint
    fd = os.open(root / "log", os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o600)
    try:
        os.write(fd, b"synced by the flag")
    finally:
        os.close(fd)
    _fsync_dir(root)
    assert mount.stats()["sync_opens"] == 1
    mount.cut(0.0, seed=1)
    mount.power_on()
    assert (root / "log").read_bytes() == b"synced by the flag"


def test_an_armed_cut_replaces_the_nth_change(mount):
    root = mount.mountpoint
    (root / "before").write_bytes(b"x")  # create, write: two changes
    _fsync_dir(root)
    mount.arm(2, 0.0, seed=1)
    os.mkdir(root / "first")  # change 1: done
    with pytest.raises(OSError):
        os.mkdir(root / "second")  # change 2: the power goes instead
    assert mount.stats()["cuts"] == 1
    mount.power_on()
    assert sorted(os.listdir(root)) == ["before"], "the unsynced mkdir went with the power"
    assert (root / "before").read_bytes() == b"", "its data was never fsync'd"


@pytest.mark.parametrize("kind", ["posix", "uring"])
def test_o_direct_writes_need_a_flush(mount, kind):
    """O_DIRECT bypasses the page cache, not a drive's write cache: the model loses such
    writes until fsync/fdatasync, through either io engine."""
    require_engine(kind)
    engine = get_engine(kind, direct=True)
    path = mount.mountpoint / "volume"
    file = engine.open(path, os.O_RDWR | os.O_CREAT)
    try:
        assert file.direct, "the power-loss file system must take O_DIRECT opens"
        assert engine.write([(file, 0, b"a" * PAGE)]) == [PAGE]
        assert engine.fsync([file]) == [0]
        assert engine.write([(file, PAGE, b"b" * PAGE)]) == [PAGE]
    finally:
        file.close()
    _fsync_dir(mount.mountpoint)
    assert mount.stats()["direct_opens"] == 1
    mount.cut(0.0, seed=1)
    mount.power_on()
    assert path.read_bytes() == b"a" * PAGE


# -- the kit's checks on defective backends ------------------------------------------------

CASES = {
    "SkipsFileFsync": ({}, {"power_cut_keeps_acknowledged", "power_cut_tears_nothing"}),
    "TrustsSyncedHeaders": ({}, {"power_cut_keeps_acknowledged", "power_cut_tears_nothing"}),
    "SkipsDirectoryFsync": ({}, {"power_cut_keeps_acknowledged", "power_cut_tears_nothing"}),
    "DeletesLazily": ({}, {"power_cut_keeps_acknowledged"}),
    "WritesLayoutUnsynced": ({}, {"power_cut_after_create"}),
    "SkipsDataFlush": ({"engine": "posix"},
                       {"power_cut_keeps_acknowledged", "power_cut_tears_nothing"}),
    "SkipsDataFlush-uring-direct": ({"engine": "uring", "direct": True},
                                    {"power_cut_keeps_acknowledged",
                                     "power_cut_tears_nothing"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_power_checks_catch(case, tmp_path):
    passed = passed_by_broken(MODULE, case, *CASES[case], tmp_path)
    assert not passed, f"the power checks let {case} pass {passed}"


def test_not_persistent_is_not_applicable(tmp_path):
    require_fuse()
    outcomes = run_kit(f"{MODULE}:NotPersistent", directory=tmp_path, names=POWER_CHECKS)
    assert {o.name for o in outcomes} == POWER_CHECKS
    for outcome in outcomes:
        reason = why_not_applicable(outcome)
        assert reason and "not persistent" in reason, outcome


def _kit_without_fuse(tmp_path, environ) -> dict:
    """Run a power check where /dev/fuse does not exist (an empty /dev in a private
    mount namespace), and return the kit's JSON report."""
    import json
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("hiding /dev/fuse needs root and unshare (util-linux)")
    script = (f"mount -t tmpfs none /dev && exec {sys.executable} -m kvstored.sdk.testing "
              f"file-per-key -k power_cut_after_create --json --dir {tmp_path}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **environ})
    assert done.stdout, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_without_fuse_the_checks_are_not_applicable(tmp_path):
    environ = {"KVSTORED_REQUIRE": ""}
    report = _kit_without_fuse(tmp_path, environ)
    [outcome] = report["checks"]
    reason = why_not_applicable_in_json(outcome)
    assert report["passed"] and reason and "/dev/fuse" in reason, outcome


def test_without_fuse_the_checks_fail_when_fuse_is_required(tmp_path):
    report = _kit_without_fuse(tmp_path, {"KVSTORED_REQUIRE": "fuse"})
    [outcome] = report["checks"]
    assert not report["passed"] and "KVSTORED_REQUIRE" in outcome["error"], outcome


def test_a_block_device_outside_the_mount_is_not_applicable(tmp_path):
    """nvmeof on a loop device writes to the device, not through the power-loss file
    system: the checks must say so rather than pass."""
    from tests.backends.test_nvmeof_conformance import loop_attached

    require_fuse()
    with loop_attached(tmp_path / "loop.img") as device:
        [outcome] = run_kit("nvmeof", {"engine": "posix", "device": device},
                            directory=tmp_path, names={"power_cut_keeps_acknowledged"})
    reason = why_not_applicable(outcome)
    assert reason and device in reason, outcome
