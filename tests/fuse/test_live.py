"""The live mount, for real: `kvstored up` on the bucket backend, `kvstore mount` on a
temporary directory, and the kernel in between."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os

import pytest
import trio
from crc32c import crc32c

import kvstored
from kvstored.fuse.live import LiveSource
from kvstored.fuse.names import key_to_name
from tests.daemon.harness import kvstore_ok, wait_for

ODD_KEYS = ["plain", "a/b/c", "/leading", "trailing/", "..", ".", ".hidden", "nul\0byte",
            "100%", "%2F", "new\nline", "tab\there", "ü-ñ-€-😀", "space d", "x" * 600,
            "é" * 510, "deep/" * 100]


def _keys(prefix: str, keys: list[str]) -> dict[str, bytes]:
    return {f"{prefix}{k}": (f"value of {prefix}{k!r}".encode() * 37) for k in keys}


def _names(directory) -> set[bytes]:
    return set(os.listdir(os.fsencode(directory)))


def test_odd_keys_list_and_read_back_their_bytes(cluster, mount):
    values = _keys("odd:", ODD_KEYS)
    with kvstored.connect(cluster.addr) as c:
        assert all(c.batch_put(list(values), list(values.values())))
    m = mount("--master", cluster.addr)
    # A hashed name resolves before anything was listed (no table entry yet).
    longest = max(values, key=len)
    with open(m / b"keys/" + key_to_name(longest), "rb") as f:
        assert f.read() == values[longest]
    listed = {n for n in _names(m / "keys") if n.startswith(b"odd:")}
    assert listed == {key_to_name(k) for k in values}
    for key, value in values.items():
        path = m / b"keys/" + key_to_name(key)
        with open(path, "rb") as f:
            assert f.read() == value, key
        assert os.stat(path).st_size == len(value)
        assert os.getxattr(path, "user.kvstored.key") == key.encode()


def test_xattrs_show_tier_size_checksum_replicas_location_and_reads(cluster, mount):
    value = os.urandom(300_000)
    with kvstored.connect(cluster.addr) as c:
        c.put("xattr:obj", value)
        kvstore_ok("flush", "--wait", master=cluster.addr)
        m = mount("--master", cluster.addr)
        path = m / "keys/xattr:obj"
        names = set(os.listxattr(path))
        assert {f"user.kvstored.{n}" for n in ("key", "tier", "size", "checksum", "replicas",
                                                "location", "reads")} == names

        def attr(name: str) -> str:
            return os.getxattr(path, f"user.kvstored.{name}").decode()

        assert attr("size") == str(len(value))
        assert attr("checksum") == f"{crc32c(value):08x}"
        assert attr("tier") == "dram,ssd"
        replicas = json.loads(attr("replicas"))
        assert {(r["tier"], r["state"]) for r in replicas} == {("dram", "complete"),
                                                               ("ssd", "complete")}
        reads_before = int(attr("reads"))
        assert path.read_bytes() == value
        assert int(attr("reads")) == reads_before + 1  # the access count the master keeps
        (node, where), = json.loads(attr("location")).items()
        assert node == replicas[0]["node"]
        assert where["dram"]["size"] == len(value)
        ssd = where["ssd"]
        with open(ssd["path"], "rb") as f:  # the location points at the value's bytes
            f.seek(ssd["offset"])
            assert f.read(ssd["length"]) == value
        assert c.locate("xattr:obj") == {node: where}
        with kvstored.connect(cluster.addr) as fresh:  # learns the node's address itself
            assert fresh.locate("xattr:obj") == {node: where}
        assert c.locate("xattr:nothing") == {}
        with pytest.raises(OSError) as missing:
            os.getxattr(path, "user.kvstored.nope")
        assert missing.value.errno == errno.ENODATA


def test_nodes_show_objects_by_tier_and_share_their_inode(cluster, mount):
    values = _keys("tiers:", ["hot", "cold", "both"])
    with kvstored.connect(cluster.addr) as c:
        c.batch_put(list(values), list(values.values()))
        kvstore_ok("flush", "--wait", master=cluster.addr)
        kvstore_ok("evict", "--tier", "dram", "--key", "tiers:cold", master=cluster.addr)
        wait_for(lambda: [r.tier for r in c.stat("tiers:cold").replicas] == ["ssd"],
                 what="the DRAM copy to go")
        node = c.stat("tiers:hot").replicas[0].node
    m = mount("--master", cluster.addr)
    assert _names(m / "nodes") >= {key_to_name(node)}
    node_dir = m / "nodes" / node
    assert _names(node_dir) == {b"dram", b"ssd"}
    in_dram = {n for n in _names(node_dir / "dram") if n.startswith(b"tiers:")}
    on_ssd = {n for n in _names(node_dir / "ssd") if n.startswith(b"tiers:")}
    assert in_dram == {b"tiers:hot", b"tiers:both"}
    assert on_ssd == {b"tiers:hot", b"tiers:cold", b"tiers:both"}
    assert (node_dir / "ssd" / "tiers:cold").read_bytes() == values["tiers:cold"]
    assert not (node_dir / "dram" / "tiers:cold").exists()
    # One object, one inode, wherever it is listed; and the same on every stat.
    inode = os.stat(m / "keys/tiers:hot").st_ino
    assert os.stat(node_dir / "dram" / "tiers:hot").st_ino == inode
    assert os.stat(node_dir / "ssd" / "tiers:hot").st_ino == inode
    assert os.stat(m / "keys/tiers:hot").st_ino == inode


def test_stats_files_are_json(cluster, mount):
    m = mount("--master", cluster.addr)
    cluster_doc = json.loads((m / "stats/cluster.json").read_text())
    assert {"nodes", "tiers", "objects", "hit_rate"} <= set(cluster_doc)
    names = [n["node"] for n in cluster_doc["nodes"]]
    assert sorted(os.listdir(m / "stats/nodes")) == sorted(f"{n}.json" for n in names)
    for name in names:
        with open(m / "stats/nodes" / f"{name}.json") as f:
            node_doc = json.load(f)
        assert node_doc["node"] == name and node_doc["alive"] is True


def test_every_write_gets_erofs(cluster, mount):
    with kvstored.connect(cluster.addr) as c:
        c.put("ro:victim", b"keep me")
    m = mount("--master", cluster.addr)
    victim = m / "keys/ro:victim"
    attempts = {
        "create": lambda: os.open(m / "keys/ro:new", os.O_CREAT | os.O_WRONLY, 0o644),
        "write": lambda: os.open(victim, os.O_RDWR),
        "append": lambda: os.open(victim, os.O_WRONLY | os.O_APPEND),
        "unlink": lambda: os.unlink(victim),
        "mkdir": lambda: os.mkdir(m / "keys/ro:dir"),
        "rmdir": lambda: os.rmdir(m / "stats/nodes"),
        "setxattr": lambda: os.setxattr(victim, "user.kvstored.tier", b"ssd"),
        "removexattr": lambda: os.removexattr(victim, "user.kvstored.tier"),
        "rename": lambda: os.rename(victim, m / "keys/ro:renamed"),
        "truncate": lambda: os.truncate(victim, 0),
        "chmod": lambda: os.chmod(victim, 0o666),
        "symlink": lambda: os.symlink("ro:victim", m / "keys/ro:link"),
        "link": lambda: os.link(victim, m / "keys/ro:hard"),
        "utime": lambda: os.utime(victim, (0, 0)),
    }
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as refused:
            attempt()
        assert refused.value.errno == errno.EROFS, what
    assert victim.read_bytes() == b"keep me"


def test_removed_key_disappears(cluster, mount):
    with kvstored.connect(cluster.addr) as c:
        c.put("gone:k", b"A" * 10_000)
        m = mount("--master", cluster.addr)
        path = m / "keys/gone:k"
        assert path.read_bytes() == b"A" * 10_000
        assert c.remove("gone:k")
        assert b"gone:k" not in _names(m / "keys")  # listings are never stale
        wait_for(lambda: not path.exists(), timeout=5, what="the cached name to expire")
        with pytest.raises(FileNotFoundError):
            path.read_bytes()


@pytest.mark.slow  # the store frees a removed key's space only once its lease ran out
def test_a_key_written_again_shows_its_new_bytes_not_cached_pages(cluster, mount):
    with kvstored.connect(cluster.addr) as c:
        c.put("again:k", b"A" * 10_000)
        m = mount("--master", cluster.addr, "--page-cache")
        path = m / "keys/again:k"
        with open(path, "rb") as held:  # the inode stays known, its pages cached
            assert held.read() == b"A" * 10_000
            assert c.remove("again:k")
            assert c.put("again:k", b"B" * 10_000)  # same size, other bytes
            assert path.read_bytes() == b"B" * 10_000


def test_thousands_of_keys_list_in_pages(cluster, mount):
    keys = [f"many:{i:05d}" for i in range(5000)]
    with kvstored.connect(cluster.addr) as c:
        for start in range(0, len(keys), 500):
            batch = keys[start:start + 500]
            c.batch_put(batch, [k.encode() for k in batch])
    m = mount("--master", cluster.addr)
    listed = [n for n in os.listdir(m / "keys") if n.startswith("many:")]
    assert sorted(listed) == keys and len(listed) == len(set(listed))
    node = os.listdir(m / "nodes")[0]
    assert sorted(n for n in os.listdir(m / "nodes" / node / "dram")
                  if n.startswith("many:")) == keys
    _check_seekdir(m / "keys", os.listdir(m / "keys"))  # in listing (key) order


def _check_seekdir(directory, expected: list[str]) -> None:
    """telldir/seekdir through libc: a listing resumed at a recent offset (a remembered
    key cursor) and at an old one (listed again and skipped) goes on where it was."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype, libc.opendir.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    libc.readdir.restype, libc.readdir.argtypes = ctypes.POINTER(_Dirent), [ctypes.c_void_p]
    libc.telldir.restype, libc.telldir.argtypes = ctypes.c_long, [ctypes.c_void_p]
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    libc.closedir.argtypes = [ctypes.c_void_p]
    handle = libc.opendir(os.fsencode(directory))
    assert handle, os.strerror(ctypes.get_errno())

    def read_rest() -> list[str]:
        names = []
        while entry := libc.readdir(handle):
            name = entry.contents.d_name.decode()
            if name not in (".", ".."):
                names.append(name)
        return names

    try:
        first = [libc.readdir(handle).contents.d_name.decode() for _ in range(10)]
        early = libc.telldir(handle)
        middle = [libc.readdir(handle).contents.d_name.decode() for _ in range(len(expected)
                                                                            - 1010)]
        late = libc.telldir(handle)
        tail = read_rest()
        assert [n for n in first + middle + tail if n not in (".", "..")] == expected
        libc.seekdir(handle, late)
        assert read_rest() == tail
        libc.seekdir(handle, early)  # thousands of entries ago: no longer remembered
        assert read_rest() == [n for n in middle + tail if n not in (".", "..")]
    finally:
        libc.closedir(handle)


class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


def test_listing_pages_through_the_master(cluster):
    keys = [f"paged:{i:05d}" for i in range(2500)]
    with kvstored.connect(cluster.addr) as c:
        c.batch_put(keys, [b"v"] * len(keys))
    source = LiveSource(kvstored.connect(cluster.addr))
    pages = []
    ask = source.client.call

    def counting(op, **args):
        reply = ask(op, **args)
        if op == "list":
            pages.append((args["limit"], len(reply["keys"])))
        return reply

    source.client.call = counting

    async def listing(**scope) -> list[str]:
        try:
            return [e.key async for e in source.entries(**scope) if e.key.startswith("paged:")]
        finally:
            await source.aclose()

    assert trio.run(listing) == keys
    assert len(pages) >= 3 and all(limit <= 1000 and n <= 1000 for limit, n in pages)


def test_page_cache_mount_reads_and_maps(cluster, mount):
    value = os.urandom(3 * 1024 * 1024 + 17)
    with kvstored.connect(cluster.addr) as c:
        c.put("mapped:k", value)
    m = mount("--master", cluster.addr, "--page-cache")
    path = m / "keys/mapped:k"
    with open(path, "rb") as f:
        assert f.read() == value
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            assert mapped[:] == value
    assert path.read_bytes() == value  # again, from the page cache
    direct = mount("--master", cluster.addr, at="direct")  # the default: direct_io
    with open(direct / "keys/mapped:k", "rb") as f:
        assert f.read() == value
        with pytest.raises(OSError) as refused:
            mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        assert refused.value.errno == errno.ENODEV  # documented: no mmap with direct_io


def test_a_filtered_list_page_may_be_empty_and_says_where_to_resume(cluster):
    cold = [f"filt:a{i:02d}" for i in range(30)]
    with kvstored.connect(cluster.addr) as c:
        c.batch_put(cold, [b"c"] * len(cold))
        kvstore_ok("flush", "--wait", master=cluster.addr)
        kvstore_ok("evict", "--tier", "dram", "--prefix", "filt:a", master=cluster.addr)
        wait_for(lambda: all(r.tier == "ssd" for k in cold for r in c.stat(k).replicas),
                 what="the DRAM copies to go")
        c.put("filt:b0", b"hot")
        node = c.stat("filt:b0").replicas[0].node
        ask = {"prefix": "filt:", "node": node, "tier": "dram", "limit": 1}
        first = c.call("list", after=None, **ask)  # looks at 20 keys, none in DRAM
        assert first["keys"] == [] and first["more"] and first["after"] == "filt:a19"
        second = c.call("list", after=first["after"], **ask)
        assert second["keys"] == ["filt:b0"] and not second["more"]
        on_ssd = c.call("list", prefix="filt:", node=node, tier="ssd", limit=1000)
        # filt:b0 joins them once the eager offload has copied it.
        assert on_ssd["keys"] in (cold, [*cold, "filt:b0"])
        assert c.call("list", prefix="filt:", node="no-such-node", limit=10)["keys"] == []
