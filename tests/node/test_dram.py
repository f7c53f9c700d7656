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
