"""The SDK's backend registry: names resolve to classes, and ``--option`` text is parsed
by each option's declared type (not by what its annotation's text contains)."""

from __future__ import annotations

import enum
import importlib.metadata
import sys

import pytest

from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.sdk import EvictionPolicy, InvalidRequestError, UnknownBackendError
from kvstored.sdk.registry import (
    BUILTIN,
    BackendNameClashWarning,
    backend_class,
    backend_options,
    known_backends,
    parse_options,
)


class Hint(enum.Enum):
    """An enum whose name contains "int": text-matching took it for a size."""

    FAST = "fast"
    SAFE = "safe"


class Tuned(FilePerKeyBackend):
    def __init__(self, path, *, hint: Hint = Hint.SAFE, ratio: float = 0.5,
                 label: str | None = None, **options) -> None:
        super().__init__(path, **options)
        self.hint, self.ratio, self.label = hint, ratio, label


def test_every_builtin_resolves():
    for name in ("bucket", "offset", "nvmeof", "3fs", "file-per-key"):
        assert name in known_backends()
        assert backend_class(name).name == name
    with pytest.raises(UnknownBackendError):
        backend_class("no-such-backend")


def test_options_are_parsed_by_their_type():
    typed = parse_options(Tuned, {"capacity": "64MiB", "auto_evict": "off", "policy": "LRU",
                                  "hint": "fast", "ratio": "0.25", "label": "none"})
    assert typed == {"capacity": 64 << 20, "auto_evict": False, "policy": EvictionPolicy.LRU,
                     "hint": Hint.FAST, "ratio": 0.25, "label": None}
    assert backend_options(Tuned)["hint"].type is Hint


def test_typed_values_from_a_configuration_file_are_kept():
    typed = parse_options(FilePerKeyBackend, {"capacity": 4096, "auto_evict": True,
                                              "policy": EvictionPolicy.FIFO})
    assert typed == {"capacity": 4096, "auto_evict": True, "policy": EvictionPolicy.FIFO}


@pytest.mark.parametrize(("option", "text", "says"), [
    ("hint", "quick", "fast, safe"),
    ("policy", "random", "fifo, lru"),
    ("capacity", "lots", "is not a size"),
    ("auto_evict", "maybe", "not a boolean"),
    ("max_value_size", "none", "is not a size"),
])
def test_a_bad_value_names_the_option_and_what_it_takes(option, text, says):
    with pytest.raises(InvalidRequestError) as caught:
        parse_options(Tuned, {option: text})
    assert f"option {option}={text!r}" in str(caught.value) and says in str(caught.value)


def test_an_unknown_option_lists_the_valid_ones():
    with pytest.raises(InvalidRequestError, match=r"valid options: .*auto_evict"):
        parse_options(FilePerKeyBackend, {"speed": "1"})


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
