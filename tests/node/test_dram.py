"""The DRAM tier's versions: a new version is written beside the committed one, and
replaces it only when it commits."""

from __future__ import annotations


def _put(dram, key: str, data: bytes) -> int:
    offset = dram.allocate(key, len(data), 1, timeout=30)
    assert offset is not None
    obj = dram.being_written(key)
    dram.view(obj)[:] = data
    return offset


def test_a_refused_put_of_a_committed_key_leaves_it_readable(dram):
    first = _put(dram, "k", b"one")
    dram.commit(dram.being_written("k"))
    second = _put(dram, "k", b"two")
    assert dram.get("k").offset == first  # still the current version while "two" is written
    assert list(dram.pin(["k"])) == ["k"]
    dram.unpin([dram.get("k")])
    assert dram.free("k", second)  # the master said "exists": only the new one goes
    assert bytes(dram.view(dram.get("k"))) == b"one"
    assert [o.key for o in dram.committed()] == ["k"]


def test_a_new_version_replaces_the_old_at_commit_and_the_old_one_is_retired(dram):
    first = _put(dram, "k", b"old")
    dram.commit(dram.being_written("k"))
    pinned = dram.pin(["k"])
    second = _put(dram, "k", b"new")
    dram.commit(dram.being_written("k"))
    assert dram.get("k").offset == second
    assert first in dram.by_offset  # retired, not freed: a reader may still use it
    assert dram.free("k", first)  # the master's late drop of the old version
    assert first in dram.by_offset  # still pinned
    dram.unpin(pinned.values())
    assert first not in dram.by_offset
    assert bytes(dram.view(dram.get("k"))) == b"new"


def test_one_put_of_a_key_at_a_time_and_abandoned_ones_expire(dram):
    _put(dram, "k", b"x")
    assert dram.allocate("k", 1, 1, timeout=30) is None
    assert dram.expire_uncommitted(now=10**9) == ["k"]
    assert dram.being_written("k") is None and dram.get("k") is None
    assert dram.used == 0


# -- held versions (get_held) --------------------------------------------------------------

def test_only_a_committed_client_put_of_the_named_version_is_held(dram):
    _put(dram, "k", b"one")
    obj = dram.being_written("k")
    assert dram.pin_held(["k"], [1]) == [None]  # not committed yet
    dram.commit(obj, held=True)
    assert dram.pin_held(["k", "k", "other"], [1, 2, 1]) == [obj, None, None]
    dram.unpin([obj])
    _put(dram, "p", b"promoted")
    dram.commit(dram.being_written("p"))  # a promotion: not a client's put here
    assert dram.pin_held(["p"], [1]) == [None]


def test_a_revoke_ends_held_for_every_version_present_even_one_not_committed_yet(dram):
    _put(dram, "k", b"old")
    old = dram.being_written("k")
    dram.commit(old, held=True)
    _put(dram, "k", b"new")  # a put of the key in flight when the master removed it
    new = dram.being_written("k")
    dram.revoke(["k"])
    assert dram.pin_held(["k"], [1]) == [None]
    dram.commit(new, held=True)  # its commit lands after the revoke
    assert dram.pin_held(["k"], [1]) == [None]
    assert not old.held and not new.held
    _put(dram, "k2", b"later")
    dram.commit(dram.being_written("k2"), held=True)  # after the revoke: held
    assert dram.pin_held(["k2"], [1])[0] is not None


def test_registering_anew_revokes_everything(dram):
    _put(dram, "k", b"one")
    dram.commit(dram.being_written("k"), held=True)
    dram.revoke_all()
    assert dram.pin_held(["k"], [1]) == [None]


def test_a_held_version_that_leaves_dram_stays_held_for_its_ssd_copy_until_revoked(dram):
    _put(dram, "k", b"v")
    dram.commit(dram.being_written("k"), held=True)
    _put(dram, "plain", b"v")
    dram.commit(dram.being_written("plain"))  # a promotion, say: never held
    assert not dram.held_on_ssd("k", 1)  # still in DRAM: served from there
    assert dram.free("k") and dram.free("plain")
    assert dram.held_on_ssd("k", 1) and not dram.held_on_ssd("k", 2)
    assert not dram.held_on_ssd("plain", 1) and not dram.held_on_ssd("other", 1)
    assert dram.pin_held(["k"], [1]) == [None]  # not from DRAM any more
    _put(dram, "k", b"v")
    dram.commit(dram.being_written("k"))  # promoted back: that held version again
    assert dram.pin_held(["k"], [1])[0] is not None and not dram.held_on_ssd("k", 1)
    dram.unpin([dram.get("k")])
    dram.free("k")
    dram.revoke(["k"])
    assert not dram.held_on_ssd("k", 1)
    _put(dram, "k", b"v")
    dram.commit(dram.being_written("k"))  # promoted after the revoke: not held
    assert dram.pin_held(["k"], [1]) == [None]
    # A revoked version leaves unheld; registering anew forgets every one that left.
    for key in ("r", "a"):
        _put(dram, key, b"v")
        dram.commit(dram.being_written(key), held=True)
    dram.revoke(["r"])
    assert dram.free("r") and dram.free("a")
    assert not dram.held_on_ssd("r", 1) and dram.held_on_ssd("a", 1)
    dram.revoke_all()
    assert not dram.held_on_ssd("a", 1)


def test_the_held_versions_that_left_dram_are_bounded(dram, monkeypatch):
    from kvstored.node import dram as module
    monkeypatch.setattr(module, "MAX_HELD_ON_SSD", 3)
    for n in range(5):
        _put(dram, f"k{n}", b"v")
        dram.commit(dram.being_written(f"k{n}"), held=True)
        dram.free(f"k{n}")
    assert [dram.held_on_ssd(f"k{n}", 1) for n in range(5)] == [False, False, True, True, True]


def test_a_freed_held_object_stays_in_memory_until_its_reader_unpins(dram):
    offset = _put(dram, "k", b"bytes a reader is sending")
    dram.commit(dram.being_written("k"), held=True)
    [obj] = dram.pin_held(["k"], [1])
    assert dram.free("k", offset)  # the eviction's drop
    assert dram.pin_held(["k"], [1]) == [None]  # no new reader
    assert offset in dram.by_offset and dram.allocate("x", 4096, 1, timeout=30) != offset
    dram.unpin([obj])
    assert offset not in dram.by_offset
