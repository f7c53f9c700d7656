"""Block keys: prefix-chained like an engine's, equal exactly when the prefix is."""

from __future__ import annotations

import numpy as np
import pytest

from kvstored.replay.keys import chained_keys, check_namespace, new_namespace
from kvstored.replay.workload import Workload
from kvstored.tools.core import build_trie

from .conftest import random_trace


def test_a_key_names_its_whole_prefix():
    a = chained_keys("ns", np.array([1, 2, 3]))
    b = chained_keys("ns", np.array([1, 2, 4]))
    c = chained_keys("ns", np.array([9, 2, 3]))
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not set(a) & set(c), "the same ids after another parent are other blocks"
    assert chained_keys("other", np.array([1]))[0] != a[0]
    assert all(k.startswith("ns/") and len(k) == 3 + 24 for k in a)


def test_keys_match_the_simulators_prefix_trie():
    """Two block events share a key exactly when they share a trie node."""
    trace = random_trace(3)
    workload = Workload(trace)
    node_of_event, _ = build_trie(trace.ids, trace.offsets)
    keys = [k for r in range(len(workload)) for k in workload.request(r).keys("t")]
    by_key, by_node = {}, {}
    for key, node in zip(keys, node_of_event.tolist()):
        assert by_key.setdefault(key, node) == node
        assert by_node.setdefault(node, key) == key
    assert len(by_key) < len(keys), "the trace repeats no prefix: the test proves nothing"


def test_namespaces():
    assert new_namespace() != new_namespace()
    assert check_namespace(new_namespace())
    for bad in ("", "a/b", "x\n", "n" * 201):
        with pytest.raises(ValueError):
            check_namespace(bad)
