"""Lookup-and-lock against a real `kvstored up`: an object a client locked survives DRAM
pressure that evicts everything around it, is read intact from DRAM, and once its lock
ends (by that read, or by its expiry) is evicted like any other.

DRAM is 64 MiB; eviction starts above 90% and frees down to 80%, least recently used
first. Each object is 4 MiB. Every wait is a poll of a condition with a deadline.
"""

from __future__ import annotations

import os
import time

import kvstored
from kvstored.protocol import Tier
from tests.daemon.conftest import embedded, spawn  # noqa: F401 - fixtures
from tests.daemon.harness import wait_for

MiB = 1 << 20
SIZE = 4 * MiB


def _in_dram(client: kvstored.Client, key: str) -> bool:
    info = client.stat(key)
    return info is not None and any(r.tier is Tier.DRAM and r.state == "complete"
                                    for r in info.replicas)


def _on_ssd(client: kvstored.Client, key: str) -> bool:
    info = client.stat(key)
    return info is not None and any(r.tier is Tier.SSD for r in info.replicas)


class Filler:
    """Puts fresh 4 MiB objects (each newer than anything locked before it)."""

    def __init__(self, client: kvstored.Client, prefix: str) -> None:
        self.client, self.prefix, self.keys = client, prefix, []

    def put(self, count: int) -> None:
        for _ in range(count):
            key = f"{self.prefix}{len(self.keys)}"
            assert self.client.put(key, os.urandom(SIZE))
            self.keys.append(key)

    def evicted(self) -> list[str]:
        return [k for k in self.keys if not _in_dram(self.client, k)]


def test_a_locked_object_survives_eviction_is_read_intact_and_then_goes(embedded):  # noqa: F811
    up = embedded(dram="64MiB")
    with kvstored.connect(up.addr) as c:
        value = os.urandom(SIZE)
        assert c.put("locks/victim", value)
        wait_for(lambda: _on_ssd(c, "locks/victim"), what="the victim's SSD copy")
        assert c.batch_lookup_and_lock(["locks/victim", "locks/none"], 60) == [True, False]
        # Past the high watermark several times over: the victim is the least recently
        # used object, and every eviction passes over it.
        fill = Filler(c, "locks/fill-")
        fill.put(20)
        wait_for(lambda: len(fill.evicted()) >= 5, what="evictions around the victim")
        assert _in_dram(c, "locks/victim")
        tiers: list[Tier | None] = []
        buf = bytearray(SIZE)
        assert c.batch_get_into(["locks/victim"], [buf], tiers=tiers) == [SIZE]
        assert bytes(buf) == value and tiers == [Tier.DRAM]
        # That read ended the lock: more pressure takes the victim now (the coldest).
        assert c.batch_unlock(["locks/victim"]) == [False]

        def victim_gone() -> bool:
            fill.put(1)
            return not _in_dram(c, "locks/victim")

        wait_for(victim_gone, what="the victim's eviction once read")
        assert c.get("locks/victim") == value  # from SSD, still intact


def test_an_expired_lock_lets_eviction_take_its_object(embedded):  # noqa: F811
    up = embedded(dram="64MiB")
    with kvstored.connect(up.addr) as c, kvstored.connect(up.addr) as other:
        assert c.put("expiry/victim", os.urandom(SIZE))
        wait_for(lambda: _on_ssd(c, "expiry/victim"), what="the victim's SSD copy")
        # DRAM filled to just under the high watermark (56 of 64 MiB) before the lock:
        # the first put under the lock passes it, so eviction presses while the lock
        # holds however slowly a loaded machine puts (filling it within the 5 s of the
        # lock did not always happen).
        fill = Filler(other, "expiry/fill-")
        fill.put(13)
        ttl = 5.0
        locked_at = time.monotonic()
        assert c.batch_lookup_and_lock(["expiry/victim"], ttl) == [True]
        # Another client's reads do not end this client's lock.
        assert other.get("expiry/victim") is not None
        pressed_while_locked = False

        def victim_gone() -> bool:
            nonlocal pressed_while_locked
            fill.put(1)
            in_dram = _in_dram(c, "expiry/victim")
            evicted = bool(fill.evicted())
            # Measured after the looks: "still locked" then was still locked at them.
            locked = time.monotonic() - locked_at < ttl
            if in_dram:
                pressed_while_locked |= locked and evicted
                return False
            # Gone: only once its lock had expired (polled every 4 MiB put).
            assert not locked, "evicted while locked"
            return True

        wait_for(victim_gone, timeout=60, what="the victim's eviction after its lock")
        assert pressed_while_locked, "nothing was evicted while the lock held"
