"""The master's collector policy: a freeze once the table has grown enough, counted
again from a table that shrank."""

from __future__ import annotations

import gc
import sys

from kvstored.master.collector import TableCollector
from kvstored.master.table import SSD, ObjectTable


def test_a_freeze_each_time_the_table_has_grown_by_the_step():
    collector = TableCollector(every=100)
    table = ObjectTable()
    try:
        assert not collector.tick(0)
        for i in range(150):
            table.commit(f"k{i:03d}", "n1", SSD, 10, 1, -1, now=0)
        assert collector.tick(len(table.objects))
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert not collector.tick(len(table.objects))      # not grown since
        meta = table.objects["k000"]
        table.drop_node("n1")                              # shrinks: counts from 0 again
        # Only this test holds it now: reference counting frees it, frozen or not.
        assert sys.getrefcount(meta) == 2
        del meta
        assert not collector.tick(0)
        for i in range(99):
            table.commit(f"j{i:03d}", "n1", SSD, 10, 1, -1, now=0)
        assert not collector.tick(len(table.objects))
        table.commit("j099", "n1", SSD, 10, 1, -1, now=0)
        assert collector.tick(len(table.objects))
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
