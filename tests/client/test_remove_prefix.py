"""Removal of a prefix against a real `kvstored up`, with puts under the prefix going on
in other threads the whole time. The semantics checked:

- a put that returned before the removal began is removed;
- a put that began after the removal returned is kept;
- a put in flight while it runs either lands before it (and is removed) or reports
  not stored, and then never appears: nothing resurrects under the removed prefix;
- nothing outside the prefix is touched.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import kvstored
from tests.daemon.conftest import embedded, spawn  # noqa: F401 - fixtures

THREADS = 3
#: Puts of each thread before the removal starts, and after it returned.
FIRST_PUTS, LATER_PUTS = 100, 20
MAX_PUTS = 20000


@dataclass
class Put:
    key: str
    began: float
    ended: float
    stored: bool


def test_a_removal_with_puts_going_on_removes_the_earlier_and_never_resurrects(embedded):  # noqa: F811
    up = embedded(dram="64MiB")
    with kvstored.connect(up.addr) as c:
        assert c.put("rp-outside/k", b"kept")
        puts: list[list[Put]] = [[] for _ in range(THREADS)]
        halfway = threading.Barrier(THREADS + 1)

        #: When the removal returned (monotonic seconds), once it has.
        removal_ended = [float("inf")]

        def writer(n: int) -> None:
            with kvstored.connect(up.addr) as mine:
                i = later = 0
                while later < LATER_PUTS and i < MAX_PUTS:
                    if i == FIRST_PUTS:
                        halfway.wait(30)  # these are in before the removal starts
                    key = f"rp/{n}/{i:05d}"
                    began = time.monotonic()
                    stored = mine.put(key, key.encode())
                    puts[n].append(Put(key, began, time.monotonic(), stored))
                    later += began > removal_ended[0]
                    i += 1

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        halfway.wait(30)
        removal_began = time.monotonic()
        removed = c.batch_remove_prefix("rp/")
        removal_ended[0] = time.monotonic()
        for t in threads:
            t.join(120)
        everything = [p for per in puts for p in per]
        present = dict(zip([p.key for p in everything],
                           c.batch_exists([p.key for p in everything])))
        before = [p for p in everything if p.ended < removal_began]
        after = [p for p in everything if p.began > removal_ended[0]]
        during = [p for p in everything if p not in before and p not in after]
        assert len(before) >= THREADS * FIRST_PUTS and len(after) >= THREADS * LATER_PUTS
        assert all(p.stored for p in before + after)
        assert not any(present[p.key] for p in before), "an earlier put survived"
        assert all(present[p.key] for p in after), "a later put was removed"
        resurrected = [p.key for p in during if not p.stored and present[p.key]]
        assert not resurrected, f"puts reported not stored appeared: {resurrected[:3]}"
        assert removed >= len(before)
        assert c.get("rp-outside/k") == b"kept"
