"""Helpers for the simulator tests: the shared reference data and small generated traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.shared_data import shared_file

__all__ = ["random_requests", "shared_file", "write_mooncake"]


def random_requests(seed: int, requests: int = 60, *, prefixes: int = 5, vocab: int = 40,
                    max_len: int = 9) -> list[list[int]]:
    """Requests that share prefixes, repeat ids, and branch: what the trie rules are for."""
    rng = np.random.default_rng(seed)
    roots = [list(rng.integers(0, vocab, size=rng.integers(1, 4))) for _ in range(prefixes)]
    out = []
    for _ in range(requests):
        ids = list(roots[rng.integers(0, prefixes)])
        ids += list(rng.integers(0, vocab, size=rng.integers(0, max_len)))
        if rng.random() < 0.2 and out:  # resend an earlier request, sometimes extended
            ids = out[rng.integers(0, len(out))] + list(rng.integers(0, vocab, size=2))
        out.append([int(i) for i in ids])
    return out


def write_mooncake(path: Path, requests: list[list], *, block_size: int = 4,
                   lengths: list[int] | None = None, with_block_size: bool = False) -> Path:
    rng = np.random.default_rng(len(requests))
    with path.open("w") as out:
        for k, ids in enumerate(requests):
            length = lengths[k] if lengths else max(1, len(ids) * block_size
                                                    - int(rng.integers(0, block_size)))
            record = {"timestamp": k * 1000, "input_length": length, "output_length": 3,
                      "hash_ids": ids}
            if with_block_size:
                record["block_size"] = block_size
            out.write(json.dumps(record) + "\n")
    return path
