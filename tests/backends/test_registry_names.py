"""The registry: an installed entry point named like a built-in backend is refused with a
warning (it never silently replaces the built-in), and command-line options are parsed
by their declared types."""

import importlib.metadata
import sys

import pytest

from kvstored.backends import (
    BUILTIN,
    BackendNameClashWarning,
    backend_class,
    coerce_options,
    known_backends,
)
from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.sdk import InvalidRequestError, OpenMode


@pytest.fixture
def impostor(tmp_path, monkeypatch):
    """A distribution on sys.path registering 'file-per-key' and 'impostor-own'."""
    info = tmp_path / "impostor-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: impostor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[kvstored.backends]\n"
        "file-per-key = tests.sdk.broken_backends:SkipsChecksum\n"
        "impostor-own = tests.sdk.broken_backends:SkipsChecksum\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield
    sys.path_importer_cache.clear()


def test_builtin_name_is_not_shadowed(impostor):
    with pytest.warns(BackendNameClashWarning, match=r"impostor registers a backend named "
                                                     r"'file-per-key'"):
        cls = backend_class("file-per-key")
    assert cls is FilePerKeyBackend
    assert BUILTIN["file-per-key"].endswith(":FilePerKeyBackend")


def test_other_names_of_the_distribution_still_register(impostor):
    with pytest.warns(BackendNameClashWarning):
        names = known_backends()
    assert "impostor-own" in names


class Blueprint(str):
    """A text option whose type's name happens to contain "int"."""


class WithTypedOptions(FilePerKeyBackend):
    def __init__(self, path, *, blueprint: Blueprint | None = None,
                 ratio: float = 0.5, strict: bool | None = None, **options) -> None:
        super().__init__(path, **options)


def test_options_are_parsed_by_their_type_not_their_annotation_text():
    typed = coerce_options(WithTypedOptions, {
        "blueprint": "print-4KiB", "ratio": "0.25", "strict": "none", "capacity": "4KiB",
        "auto_evict": "no", "mode": "read-only"})
    assert typed == {"blueprint": "print-4KiB", "ratio": 0.25, "strict": None,
                     "capacity": 4096, "auto_evict": False, "mode": OpenMode.READ_ONLY}
    assert coerce_options(WithTypedOptions, {"strict": "yes"}) == {"strict": True}
    with pytest.raises(InvalidRequestError, match="ratio"):
        coerce_options(WithTypedOptions, {"ratio": "lots"})
