"""Readers of request-per-line JSONL traces: Mooncake and Qwen-Bailian.

- Mooncake: ``{"timestamp": ms, "input_length": L, "output_length": n, "hash_ids": [...]}``.
- Bailian: ``{"chat_id", "parent_chat_id", "timestamp": s, "input_length",
  "output_length", "type", "turn", "hash_ids"}``.

Both are replayed in file order. A line may carry ``block_size`` (all such lines must
agree; it wins over the command line) and ``block_tokens`` (explicit weights, one per id).
A record without hash ids is skipped and counted, as the reference does; anything else
malformed is an error naming the file and line, or with ``--skip-bad-lines`` a bad line
that is left out and counted (``BadLines``).

Parsing speed matters (it is most of a sweep's time on large traces): records whose
fields have the plain types take a short path, ids are converted in batches of millions
by one numpy call, and only records that need it are checked field by field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvstored.tools import events
from kvstored.tools.errors import TraceError, UsageProblem
from kvstored.tools.ids import IdInterner, fast_keys
from kvstored.tools.textio import STRICT, BadLines, json_lines

#: Block size and timestamp unit (seconds per unit) of each format.
DEFAULTS = {"mooncake": (512, 1e-3), "bailian": (16, 1.0)}
_FLUSH_IDS = 1 << 16        # integer ids: converted 65,536 at a time
_FLUSH_STRING_IDS = 1 << 14  # string ids cost ~70 bytes each while pending: fewer


def _mib(size: int) -> str:
    return f"{size / (1 << 20):,.1f} MiB"


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != int(value) or value <= 0:
        return None
    return int(value)


class _Reader:
    def __init__(self, fmt: str, bad: BadLines = STRICT) -> None:
        self.fmt = fmt
        self.bad = bad
        self.dropped: list[int] = []      # requests whose ids turned out malformed
        self.interner = IdInterner()
        self.counts: list[int] = []
        self.lengths: list[int] = []
        self.outputs: list[int] = []
        self.stamps: list[float] = []
        self.kinds: list | None = [] if fmt == "bailian" else None  # request types
        self.explicit: dict[int, list[int]] = {}
        self.block_size: int | None = None
        self.block_size_at = ""
        self.skipped = 0
        # Ids not yet converted, and where their records came from (for error messages).
        self.pending: list = []
        self.pending_from = 0             # first record index in pending
        self.record_lines: list[tuple[Path, int]] = []  # of pending records
        self.chunks: list[np.ndarray] = []
        self.flush_at = _FLUSH_IDS

    def read(self, path: Path, read: Callable[[int], None] | None = None) -> None:
        counts, lengths, outputs, stamps = self.counts, self.lengths, self.outputs, self.stamps
        pending, record_lines = self.pending, self.record_lines
        for number, record, mentions_bool in json_lines(path, self.bad, read=read):
            if type(record) is not dict:
                self.bad.add(TraceError(path, f"is a JSON {type(record).__name__}, not an "
                                              "object with hash_ids and input_length",
                                        line=number))
                continue
            hash_ids = record.get("hash_ids")
            length = record.get("input_length")
            stamp = record.get("timestamp", 0)
            output = record.get("output_length", 0)
            if (type(hash_ids) is not list or not hash_ids or type(length) is not int
                    or length <= 0 or type(stamp) not in (int, float)
                    or type(output) not in (int, float) or "block_size" in record
                    or "block_tokens" in record or mentions_bool):
                try:
                    if not self._checked(path, number, record, mentions_bool):
                        continue
                except TraceError as exc:
                    self.bad.add(exc)
                    continue
                output = record.get("output_length", 0)
                length = int(record["input_length"])
            else:
                pending.extend(hash_ids)
                record_lines.append((path, number))
                if type(hash_ids[0]) is str:
                    self.flush_at = _FLUSH_STRING_IDS
            counts.append(len(hash_ids))
            lengths.append(length)
            outputs.append(int(output))
            stamps.append(stamp)
            if self.kinds is not None:
                self.kinds.append(record.get("type"))
            if len(pending) >= self.flush_at:
                self.flush()

    def _checked(self, path: Path, number: int, record: dict, mentions_bool: bool) -> bool:
        """The slow path: validate every field; False when the record is skipped."""
        hash_ids = record.get("hash_ids")
        if hash_ids is None or hash_ids == []:
            self.skipped += 1
            return False
        if not isinstance(hash_ids, list):
            raise TraceError(path, "hash_ids is not a list", line=number)
        if _positive_int(record.get("input_length")) is None:
            raise TraceError(path, "input_length must be a positive integer, got "
                                   f"{record.get('input_length')!r}", line=number)
        for name in ("timestamp", "output_length"):
            value = record.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TraceError(path, f"{name} must be a number, got {value!r}", line=number)
        size = None
        if record.get("block_size") is not None:
            size = _positive_int(record["block_size"])
            if size is None:
                raise TraceError(path, "block_size must be a positive integer, got "
                                       f"{record['block_size']!r}", line=number)
            if self.block_size is not None and size != self.block_size:
                raise TraceError(path, f"block_size {size} differs from {self.block_size} "
                                       f"(set at {self.block_size_at}); a trace has one "
                                       "block size", line=number)
        checked = None
        if record.get("block_tokens") is not None:
            weights = record["block_tokens"]
            valid = isinstance(weights, list) and len(weights) == len(hash_ids)
            checked = [_positive_int(w) for w in weights] if valid else []
            if not valid or None in checked:
                raise TraceError(path, "block_tokens must list one positive integer per "
                                       "hash id", line=number)
        keys = None
        if mentions_bool:
            try:
                keys = np.array(self.interner.keys(hash_ids), dtype=np.int64)
            except ValueError as exc:
                raise TraceError(path, str(exc), line=number) from None
        # Valid: only now does the record change the reader's state.
        if size is not None and self.block_size is None:
            self.block_size, self.block_size_at = size, f"{path}:{number}"
        if checked is not None:
            self.explicit[len(self.counts)] = checked
        if keys is not None:
            self.flush()
            self.pending_from += 1
            self.chunks.append(keys)
        else:
            self.pending.extend(hash_ids)
            self.record_lines.append((path, number))
        return True

    def flush(self) -> None:
        """Convert the pending ids: one numpy call when they are all plain integers,
        record by record (naming the bad one) otherwise."""
        if self.pending:
            keys = fast_keys(self.pending) if type(self.pending[0]) is int else None
            if keys is None:
                keys = self.interner.batch(self.pending)
            if keys is None:
                parts, at = [], 0
                for offset, (path, number) in enumerate(self.record_lines):
                    count = self.counts[self.pending_from + offset]
                    try:
                        parts.append(np.array(
                            self.interner.keys(self.pending[at:at + count]), dtype=np.int64))
                    except ValueError as exc:
                        self.bad.add(TraceError(path, str(exc), line=number))
                        self.dropped.append(self.pending_from + offset)
                    at += count
                keys = np.concatenate(parts)
            self.chunks.append(keys)
        self.pending.clear()
        self.pending_from += len(self.record_lines)
        self.record_lines.clear()


    def drop_bad_requests(self) -> None:
        """Leave out the requests whose ids were malformed (``--skip-bad-lines``)."""
        if not self.dropped:
            return
        gone = set(self.dropped)
        keep = [r for r in range(len(self.counts)) if r not in gone]
        self.counts = [self.counts[r] for r in keep]
        self.lengths = [self.lengths[r] for r in keep]
        self.outputs = [self.outputs[r] for r in keep]
        self.stamps = [self.stamps[r] for r in keep]
        if self.kinds is not None:
            self.kinds = [self.kinds[r] for r in keep]
        new_index = {old: new for new, old in enumerate(keep)}
        self.explicit = {new_index[r]: w for r, w in self.explicit.items() if r in new_index}


def read_requests(paths: list[Path], fmt: str, block_size: int | None,
                  bad: BadLines = STRICT, *, keep_id_names: bool = True,
                  progress: Callable[[float, float, str], None] | None = None
                  ) -> events.EventTrace:
    """Read one or more JSONL files of format ``fmt``, replayed one after another.
    Without ``keep_id_names`` the texts of string ids are dropped as soon as every id
    has its key (a replay compares keys only). ``progress(done, total, label)`` counts
    the bytes of the files read."""
    default_block, seconds_per_unit = DEFAULTS[fmt]
    reader = _Reader(fmt, bad)
    sizes = [p.stat().st_size for p in paths] if progress is not None else []
    for index, path in enumerate(paths):
        before, total = sum(sizes[:index]), sum(sizes)
        reader.read(path, None if progress is None else (
            lambda done, before=before, total=total: progress(
                before + done, total, f"reading the trace: {_mib(before + done)} of "
                                      f"{_mib(total)}")))
    reader.flush()
    reader.drop_bad_requests()
    names = reader.interner.names if keep_id_names else []
    reader.interner = None  # without the names, this frees the texts before the arrays
    if not reader.counts:
        raise TraceError(", ".join(map(str, paths)), "holds no request with hash_ids and "
                                                     "input_length")
    size = reader.block_size or block_size or default_block
    if size <= 0:
        raise UsageProblem(f"--block-size must be positive, got {size}")
    ids = np.concatenate(reader.chunks)
    if len(ids) > events.MAX_EVENTS:
        raise UsageProblem(f"the trace has {len(ids)} block events; the simulator handles "
                           f"at most {events.MAX_EVENTS}")
    trace = events.build(
        ids, np.array(reader.counts, dtype=np.int64), np.array(reader.lengths, dtype=np.int64),
        np.array(reader.stamps, dtype=np.float64) * seconds_per_unit,
        np.array(reader.outputs, dtype=np.int64), size, fmt,
        sources=[str(p) for p in paths], skipped=reader.skipped,
        id_names=names, explicit_tokens=reader.explicit, kinds=reader.kinds)
    if bad.skip:
        trace.bad_lines = bad.to_dict()
    return trace
