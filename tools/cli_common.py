"""What ``kvstore sim`` and ``kvstore trace`` share: options and out-of-memory hints (their
progress bar is :func:`kvstored.progress.progress_bar`).

Their errors are the tools' (:mod:`kvstored.tools.errors`), which the CLI's one table
turns into exit codes; nothing here prints an error or exits.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

import click

from kvstored.sdk.units import parse_size
from kvstored.tools.errors import ToolError, UsageProblem

FORMAT_CHOICE = click.Choice(["auto", "mooncake", "sessions", "bailian", "binary"])


def explains_memory_errors(command: Callable) -> Callable:
    """Turn running out of memory into a :class:`ToolError` that says what to try; every
    other error reaches the CLI's one table as it is."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except MemoryError as exc:
            raise ToolError(f"out of memory ({exc}); try a smaller trace or --jobs 1") \
                from None

    return wrapper


def write_file(path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all (through ``NAME.partial``); a failure is a
    usage error naming the file."""
    partial = path.with_name(path.name + ".partial")
    try:
        if isinstance(data, str):
            partial.write_text(data)
        else:
            partial.write_bytes(data)
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UsageProblem(f"{path}: cannot write ({exc.strerror or exc})") from None


def split_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_gib(text: str) -> float:
    """A budget: a size (``512GiB``, ``2TiB``, ``500GB``) or a bare number of GiB."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    try:
        return parse_size(text) / (1 << 30)
    except ValueError as exc:
        raise UsageProblem(f"{exc}; a bare number means GiB") from None


def parse_gib_list(text: str | None) -> list[float] | None:
    parts = split_list(text)
    return None if parts is None else [parse_gib(p) for p in parts]


def parse_int_list(text: str | None, what: str) -> list[int] | None:
    parts = split_list(text)
    if parts is None:
        return None
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise UsageProblem(f"{what} takes whole numbers separated by commas, got {text!r}") \
            from None
