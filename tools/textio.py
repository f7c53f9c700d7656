"""Opening trace files: plain or gzip, by line, with the line number for errors."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from json import scanner
from pathlib import Path
from typing import BinaryIO

from kvstored.tools.errors import TraceError, TraceNotFoundError


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when it ends in ``.gz``."""
    if not path.exists():
        raise TraceNotFoundError(f"{path}: no such file; give a trace file or directory")
    if path.is_dir():
        raise TraceNotFoundError(f"{path}: is a directory; give a trace file")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return path.open("rb")


_SCAN = scanner.make_scanner(json.JSONDecoder())  # the C scanner, without loads' overhead


def _decode(line: bytes) -> object:
    """One JSON value from a line; ValueError when it is not exactly one."""
    text = line.decode("utf-8")
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:  # leading whitespace, or not JSON: let loads decide
        return json.loads(text)
    if end != len(text) and text[end:].strip():
        return json.loads(text)  # raises "Extra data" with the position
    return value


def json_lines(path: Path) -> Iterator[tuple[int, object, bool]]:
    """``(line number, value, mentions_bool)`` for every non-blank line. A line that is not
    one JSON value raises TraceError naming it. ``mentions_bool`` says the line contains
    ``true`` or ``false`` somewhere (searched per 4 MiB block, so nearly free): numpy would
    silently take a boolean id for 0 or 1, so such records get checked one id at a time."""
    number = 0
    with open_binary(path) as handle:
        try:
            while True:
                block = handle.readlines(1 << 22)
                if not block:
                    break
                joined = b"".join(block)
                suspicious = b"true" in joined or b"false" in joined
                for line in block:
                    number += 1
                    try:
                        value = _decode(line)
                    except (ValueError, UnicodeDecodeError) as exc:
                        if not line.strip():
                            continue
                        raise TraceError(path, f"not valid JSON ({exc}); each line must be "
                                               "one JSON object", line=number) from None
                    yield number, value, suspicious and (b"true" in line or b"false" in line)
        except (OSError, EOFError) as exc:  # a truncated or corrupt .gz
            raise TraceError(path, f"cannot be read: {exc}") from None


def first_value(path: Path) -> object:
    """The first JSON value of a file: a JSONL file's first line, or a whole JSON file."""
    with open_binary(path) as handle:
        head = handle.read(1 << 20)
    text = head.lstrip()
    if not text:
        raise TraceError(path, "is empty")
    line = text.split(b"\n", 1)[0]
    try:
        return json.loads(line)
    except ValueError:
        pass
    try:  # one JSON document over several lines (a session file)
        with open_binary(path) as handle:
            return json.loads(handle.read())
    except ValueError as exc:
        raise TraceError(path, f"not valid JSON ({exc})") from None
