"""The adapters' shared seam and keys, without any engine: objects made of pieces over a
real `kvstored up`, handed to the client as the engine's own memory (no staging copy),
short and oversized objects, failures reported as misses; namespaces that keep parts
apart."""

from __future__ import annotations

import pytest

from kvstored.client import MISSING, connect
from kvstored.integrations.namespace import Namespace, dtype_name, escape_part
from kvstored.integrations.objects import DEFAULT_LOCK_TTL, ObjectIO, StoreSettings, byte_view
from tests.integrations.conftest import start_store


def pieces(rng, sizes: list[int]) -> list[memoryview]:
    return [memoryview(bytearray(rng.randbytes(n))) for n in sizes]


def empty_like(obj: list[memoryview]) -> list[memoryview]:
    return [memoryview(bytearray(p.nbytes)) for p in obj]


def joined(obj: list[memoryview]) -> bytes:
    return b"".join(bytes(p) for p in obj)


@pytest.fixture
def io(store):
    objects = ObjectIO(connect(store.addr))
    yield objects
    objects.close()


def test_objects_of_several_pieces_go_to_the_client_as_the_engines_own_memory(io, store,
                                                                             rng):
    keys = [f"test/objects/{rng.getrandbits(64):x}/{i}" for i in range(6)]
    objects = [pieces(rng, [1000, 7, 500]) for _ in range(3)] + \
              [pieces(rng, [4096])] + [pieces(rng, [2000, 2000])] + [pieces(rng, [1])]
    handed: list[list[memoryview]] = []
    core = io.client.core
    core_put, core_get = core.batch_put_parts, core.read_into_parts

    def put_parts(ks, objs):
        handed.extend(objs)
        return core_put(ks, objs)

    def get_into_parts(ks, objs, tiers=None):
        handed.extend(objs)
        return core_get(ks, objs, tiers)

    core.batch_put_parts, core.read_into_parts = put_parts, get_into_parts
    assert io.put(keys, objects) == [True] * 6
    assert io.put(keys, objects) == [True] * 6  # already there: still in the store
    targets = [empty_like(obj) for obj in objects]
    assert io.get(keys, targets) == [True] * 6
    assert [joined(t) for t in targets] == [joined(o) for o in objects]
    with connect(store.addr) as c:
        assert c.get(keys[4]) == joined(objects[4])  # the object is the pieces, in order
    # The client was handed the engine's own pieces (no staging buffer between), and the
    # adapter copied nothing itself.
    assert [[id(p) for p in obj] for obj in handed] == \
        [[id(p) for p in obj] for obj in [*objects, *objects, *targets]]
    assert io.copies.gathered_bytes == io.copies.scattered_bytes == 0


def test_prefix_and_presence(io, rng):
    keys = [f"test/prefix/{rng.getrandbits(64):x}/{i}" for i in range(4)]
    io.put([keys[0], keys[1], keys[3]], [pieces(rng, [10]) for _ in range(3)])
    assert io.leading_present(keys) == 2
    assert io.present(keys) == [True, True, False, True]
    assert io.leading_present([]) == 0 and io.present([]) == []


def test_short_objects_read_up_to_their_length_and_larger_ones_are_misses(io, rng):
    base = f"test/upto/{rng.getrandbits(64):x}"
    io.client.batch_put([f"{base}/short", f"{base}/long"], [b"a" * 30, b"b" * 300])
    short, long_, absent = ([memoryview(bytearray(20)), memoryview(bytearray(80))]
                            for _ in range(3))
    lengths = io.get_upto([f"{base}/short", f"{base}/long", f"{base}/absent"],
                          [short, long_, absent])
    assert lengths == [30, MISSING, MISSING]
    assert joined(short)[:30] == b"a" * 30
    assert joined(long_) == bytes(100)  # refused before any byte landed
    assert io.get([f"{base}/short"], [empty_like(short)]) == [False]


def test_a_store_that_went_away_is_a_miss_not_an_error(tmp_path, rng):
    daemon = start_store(tmp_path)
    io = ObjectIO(connect(daemon.addr))
    key = f"test/gone/{rng.getrandbits(64):x}"
    assert io.put([key], [pieces(rng, [100, 100])]) == [True]
    daemon.stop()
    assert io.put([key + "x"], [pieces(rng, [10])]) == [False]
    assert io.get([key], [empty_like(pieces(rng, [100, 100]))]) == [False]
    assert io.leading_present([key]) == 0
    assert io.present([key]) == [False]
    io.close()


def test_settings_come_from_the_engines_options(monkeypatch, tmp_path):
    monkeypatch.setenv("KVSTORE_MASTER", "10.1.2.3:7000")
    assert StoreSettings.from_options({}).master == "10.1.2.3:7000"
    monkeypatch.delenv("KVSTORE_MASTER")
    assert StoreSettings.from_options({}).master == "127.0.0.1:7700"
    got = StoreSettings.from_options({"p.master": "h:1", "p.timeout": "2.5",
                                      "p.transport": "tcp", "p.token_file": "/t"}, prefix="p.")
    assert got == StoreSettings("h:1", "tcp", 2.5, "/t")
    with pytest.raises(ValueError, match="timeout must be a number"):
        StoreSettings.from_options({"timeout": "soon"})
    assert StoreSettings.from_options({}).lock_ttl == DEFAULT_LOCK_TTL
    assert StoreSettings.from_options({"lock_ttl": "0"}).lock_ttl == 0.0  # no locks
    for bad in ("-1", "nan", "later"):
        with pytest.raises(ValueError, match="lock_ttl must be a number of seconds"):
            StoreSettings.from_options({"lock_ttl": bad})


def test_what_the_engine_leaves_unset_is_kvstoreds_client_configuration(monkeypatch,
                                                                         tmp_path):
    """One path for the client settings: an adapter reads the configuration like the
    daemon and kvstore do (file < KVSTORED_CLIENT_* < the engine's own options)."""
    config = tmp_path / "kvstored.toml"
    config.write_text('[client]\nmaster = "10.0.0.9:7701"\ntransport = "shm"\n')
    monkeypatch.setenv("KVSTORED_CONFIG", str(config))
    monkeypatch.setenv("KVSTORED_CLIENT_TIMEOUT", "7s")
    assert StoreSettings.from_options({}) == StoreSettings("10.0.0.9:7701", "shm", 7.0)
    assert StoreSettings.from_options({"transport": "tcp", "timeout": 1}) == \
        StoreSettings("10.0.0.9:7701", "tcp", 1.0)


def test_namespaces_never_merge_parts():
    a = Namespace.of("sglang", ["org/model", "bf16"])
    b = Namespace.of("sglang", ["org", "model/bf16"])
    assert a.prefix == "sglang/org%2Fmodel/bf16/" and a.prefix != b.prefix
    assert escape_part("50%/x") == "50%25%2Fx"
    assert a.key("abc") == "sglang/org%2Fmodel/bf16/abc"
    assert a.keys(["x", "y"]) == [a.prefix + "x", a.prefix + "y"]
    with pytest.raises(ValueError, match="empty"):
        Namespace.of("vllm", ["model", ""])
    assert dtype_name("torch.bfloat16") == "bfloat16"


def test_byte_views_refuse_what_a_get_cannot_write():
    assert byte_view(bytearray(4)).nbytes == 4
    with pytest.raises(ValueError, match="writable"):
        byte_view(b"read-only")
    assert byte_view(b"read-only", writable=False).nbytes == 9
    with pytest.raises(ValueError, match="contiguous"):
        byte_view(memoryview(bytearray(8))[::2])
