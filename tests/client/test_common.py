"""What the two clients share: how a node get is cut below the node's staging budget."""

from __future__ import annotations

from kvstored.client.common import split_by_bytes


def test_gets_are_split_below_the_budget_in_order():
    assert split_by_bytes([3, 3, 3], None) == [[0, 1, 2]]
    assert split_by_bytes([3, 3, 3], 9) == [[0, 1, 2]]
    assert split_by_bytes([3, 3, 3], 6) == [[0, 1], [2]]
    assert split_by_bytes([10, 1, 1], 5) == [[0], [1, 2]]  # too big alone: alone
    assert split_by_bytes([0, 0, 7], 5) == [[0, 1], [2]]
    assert split_by_bytes([], 5) == [[]]
