"""Keys <-> file names: reversible, valid, unambiguous (property tests; no FUSE needed)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvstored.fuse.errors import InvalidName
from kvstored.fuse.names import (
    MAX_NAME_BYTES,
    HashedNames,
    digest,
    is_hashed,
    key_to_name,
    parse_name,
)
from kvstored.sdk.errors import InvalidKeyError
from kvstored.sdk.types import MAX_KEY_BYTES

# Characters the encoding has to care about, mixed with ordinary and wide ones.
_ALPHABET = st.one_of(st.sampled_from("/%.\0\n\x7f\x1f# üé€😀aZ0"),
                      st.characters(codec="utf-8"))


def _fits(key: str) -> bool:
    return 0 < len(key.encode("utf-8")) <= MAX_KEY_BYTES


keys = st.one_of(
    st.lists(st.one_of(_ALPHABET, st.sampled_from(["%2F", "..", "%#", "%25"])),
             min_size=1, max_size=40).map("".join),
    # Long keys, many of whose names must be hashed; wide characters test the cut.
    st.text(_ALPHABET, min_size=80, max_size=400),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=1024),
).filter(_fits)


def _check_name(name: bytes) -> None:
    assert 0 < len(name) <= MAX_NAME_BYTES
    assert b"/" not in name and b"\0" not in name
    assert name not in (b".", b"..") and not name.startswith(b".")
    name.decode("utf-8")  # names stay valid UTF-8, so tools print them


@settings(max_examples=300)
@given(keys)
@example("..")
@example(".")
@example("a/b\0c%d")
@example("%" * 1024)
@example("é" * 512)
@example("😀" * 256)
def test_every_key_has_a_valid_name_that_leads_back_to_it(key):
    name = key_to_name(key)
    _check_name(name)
    parsed = parse_name(name)
    if is_hashed(name):
        assert parsed.key is None
        assert key.startswith(parsed.prefix) and parsed.digest == digest(key)
        # The readable part is as long as fits: cut at most an escape or a character short.
        assert len(name) >= MAX_NAME_BYTES - 3
    else:
        assert parsed.key == key


@settings(max_examples=100)
@given(st.lists(keys, min_size=2, max_size=20, unique=True))
def test_distinct_keys_get_distinct_names(batch):
    assert len({key_to_name(k) for k in batch}) == len(batch)


def test_near_misses_get_distinct_names():
    for a, b in [("a/b", "a%2Fb"), (".x", "%2Ex"), ("x" * 300 + "1", "x" * 300 + "2"),
                 ("\0", "%00"), ("." + "y" * 300, "%2E" + "y" * 300)]:
        assert key_to_name(a) != key_to_name(b)


def test_the_form_switches_exactly_at_255_bytes():
    assert key_to_name("k" * 255) == b"k" * 255
    assert is_hashed(key_to_name("k" * 256))
    # Escapes count at their encoded length: 85 slashes are 255 bytes of name.
    assert key_to_name("/" * 85) == b"%2F" * 85
    assert is_hashed(key_to_name("/" * 86))


def test_a_hashed_name_never_cuts_an_escape_or_a_character():
    for key in ["a" + "/" * 400, "ab" + "/" * 400, "€" * 300, "a€" * 150]:
        parsed = parse_name(key_to_name(key))
        assert key.startswith(parsed.prefix)


@pytest.mark.parametrize("name", [
    b"", b".", b"..", b".hidden", b"a/b", b"a\0b", b"%", b"%2", b"%2f", b"%41", b"100%",
    b"%2G", b"\xff\xfe", b"abc%#0123", b"abc%#" + b"g" * 32, b"abc%#" + b"A" * 32,
    b"x" * 256,
])
def test_names_no_key_has_are_refused(name):
    with pytest.raises(InvalidName):
        parse_name(name)


def test_invalid_keys_have_no_name():
    for key in ["", "x" * (MAX_KEY_BYTES + 1)]:
        with pytest.raises(InvalidKeyError):
            key_to_name(key)


def test_recent_hashed_names_are_remembered_and_bounded():
    table = HashedNames(capacity=2)
    long_keys = [c * 400 for c in "abc"]
    for key in long_keys:
        table.note(key, key_to_name(key))
    table.note("short", key_to_name("short"))  # plain names are not stored
    parsed = [parse_name(key_to_name(k)) for k in long_keys]
    assert table.get(parsed[0]) is None  # the oldest went first
    assert [table.get(p) for p in parsed[1:]] == long_keys[1:]
    assert table.get(parse_name(b"short")) == "short"
