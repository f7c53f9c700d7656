"""Opening trace files: plain or gzip, by line, with the line number for errors; standard
input spooled to a file; lines that are not JSON either fatal or skipped and counted."""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from json import scanner
from pathlib import Path
from typing import BinaryIO

from kvstored.tools.errors import SHOWN_AS, TraceError, TraceNotFoundError, shown

STDIN = "-"
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class BadLines:
    """What ``--skip-bad-lines`` left out: a line that is not JSON, or a record that is
    not a valid request or session. Without it (``skip=False``) the first one stops
    the run with its file and line."""

    skip: bool = False
    count: int = 0
    examples: list[str] = field(default_factory=list)
    KEEP = 5

    def add(self, error: TraceError) -> None:
        """Count a bad line, or raise its error when not skipping."""
        if not self.skip:
            raise error
        self.count += 1
        if len(self.examples) < self.KEEP:
            self.examples.append(str(error))

    def to_dict(self) -> dict:
        return {"skipped": self.count, "examples": list(self.examples)}


STRICT = BadLines()


@contextlib.contextmanager
def spooled_stdin() -> Iterator[Path]:
    """Standard input copied to a temporary file (named ``-`` in messages), so that the
    format can be detected and a gzip stream recognised; removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="kvstore-stdin-"))
    source = sys.stdin.buffer
    head = source.read(2)
    target = folder / ("stdin.gz" if head == _GZIP_MAGIC else "stdin.jsonl")
    try:
        with target.open("wb") as out:
            out.write(head)
            shutil.copyfileobj(source, out, 1 << 20)
        if target.stat().st_size == 0:
            raise TraceNotFoundError("-: standard input is empty; pipe a trace into it")
        SHOWN_AS[str(target)] = STDIN
        yield target
    finally:
        SHOWN_AS.pop(str(target), None)
        shutil.rmtree(folder, ignore_errors=True)


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when it ends in ``.gz``."""
    if not path.exists():
        raise TraceNotFoundError(f"{shown(path)}: no such file; give a trace file or "
                                 "directory")
    if path.is_dir():
        raise TraceNotFoundError(f"{shown(path)}: is a directory; give a trace file")
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


def json_lines(path: Path, bad: BadLines = STRICT, *,
               read: Callable[[int], None] | None = None
               ) -> Iterator[tuple[int, object, bool]]:
    """``(line number, value, mentions_bool)`` for every non-blank line. A line that is not
    one JSON value goes to ``bad`` (which raises TraceError naming it unless it skips).
    ``mentions_bool`` says the line contains
    ``true`` or ``false`` somewhere (searched per 1 MiB block, so nearly free): numpy would
    silently take a boolean id for 0 or 1, so such records get checked one id at a time.
    ``read`` is told, per block, how many bytes of the file (compressed, for a ``.gz``)
    have been read: a progress bar's measure."""
    number = 0
    with open_binary(path) as handle:
        # A gzip stream's position in its compressed file is what the file's size counts.
        raw = getattr(handle, "fileobj", None) or handle
        try:
            while True:
                block = handle.readlines(1 << 20)
                if read is not None:
                    read(raw.tell())
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
                        bad.add(TraceError(path, f"not valid JSON ({exc}); each line must "
                                                 "be one JSON object", line=number))
                        continue
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
