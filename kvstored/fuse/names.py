"""Keys <-> file names: a reversible, unambiguous encoding.

A key is any UTF-8 string of at most 1024 bytes: it may hold ``/``, NUL, newlines, or be
``.`` or ``..``. A file name is at most 255 bytes and holds neither ``/`` nor NUL. The
encoding works on the key's UTF-8 bytes:

- ``%``, ``/``, NUL, the other C0 control bytes and DEL become ``%XX`` (upper-case hex),
  and so does a leading ``.`` (so no name is ``.``, ``..`` or hidden); every other byte,
  non-ASCII included, stays as it is, so names stay readable.
- When that escaped form fits in 255 bytes it is the name (a *plain* name), and decoding
  it gives the key back.
- Otherwise the name is *hashed*: the first bytes of the escaped form (cut at a whole
  escape and a whole UTF-8 character) then ``%#`` and 32 hex digits of the key's
  BLAKE2b-128 digest. ``%#`` never occurs in a plain name, so the two forms cannot be
  confused; the readable part is a prefix of the key, which is how a hashed name is
  found again (see :class:`HashedNames`), and the full key is in the file's
  ``user.kvstored.key`` attribute.

Every name has exactly one key: a name that decodes but does not re-encode to itself
(``%2f`` for ``%2F``, a bare ``%``) is not a name of this file system.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass

from kvstored.fuse.errors import InvalidName
from kvstored.sdk.errors import InvalidKeyError
from kvstored.sdk.types import encode_key

#: The longest file name Linux accepts (NAME_MAX).
MAX_NAME_BYTES = 255
#: Marks a hashed name; a plain name never contains it.
HASH_MARK = b"%#"
#: Hex digits of the digest in a hashed name (128 bits).
DIGEST_HEX = 32
#: The readable part of a hashed name is at most this long.
HASHED_PREFIX_BYTES = MAX_NAME_BYTES - len(HASH_MARK) - DIGEST_HEX

_ESCAPED = re.compile(rb"[\x00-\x1f\x7f%/]")
_ESCAPE = re.compile(rb"%([0-9A-F]{2})")
_HEX = re.compile(rb"[0-9a-f]{32}")


def _escape(raw: bytes) -> bytes:
    escaped = _ESCAPED.sub(lambda m: b"%%%02X" % m[0][0], raw)
    if escaped.startswith(b"."):
        escaped = b"%2E" + escaped[1:]
    return escaped


def _unescape(name: bytes) -> str:
    raw = _ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), name)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidName(f"{name!r} does not decode to UTF-8") from None


def digest(key: str) -> str:
    """The 32 hex digits that stand for ``key`` in a hashed name."""
    return hashlib.blake2b(key.encode("utf-8"), digest_size=DIGEST_HEX // 2).hexdigest()


def _readable_cut(escaped: bytes) -> int:
    """How much of ``escaped`` a hashed name keeps: at most HASHED_PREFIX_BYTES, ending
    neither inside a ``%XX`` escape nor inside a UTF-8 character."""
    cut = HASHED_PREFIX_BYTES
    if escaped[cut - 1] == 0x25:  # "%" is the last kept byte: the escape is cut
        cut -= 1
    elif escaped[cut - 2] == 0x25:
        cut -= 2
    while cut > 0 and escaped[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte
        cut -= 1
    return cut


def key_to_name(key: str) -> bytes:
    """The file name of ``key``. Raises :class:`InvalidKeyError` for an invalid key."""
    escaped = _escape(encode_key(key))
    if len(escaped) <= MAX_NAME_BYTES:
        return escaped
    return escaped[:_readable_cut(escaped)] + HASH_MARK + digest(key).encode("ascii")


def is_hashed(name: bytes) -> bool:
    return HASH_MARK in name


@dataclass(frozen=True, slots=True)
class ParsedName:
    """What a name says: the key for a plain name; for a hashed one, the key's prefix
    and digest (the key itself has to be looked up)."""

    key: str | None
    prefix: str
    digest: str | None


def parse_name(name: bytes) -> ParsedName:
    """Decode a file name. Raises :class:`InvalidName` if no key has this name."""
    if not name or len(name) > MAX_NAME_BYTES or b"/" in name or b"\0" in name:
        raise InvalidName(f"{name!r} is not a valid file name")
    mark = name.find(HASH_MARK)
    if mark < 0:
        key = _unescape(name)
        try:
            if key_to_name(key) != name:
                raise InvalidName(f"{name!r} is not in canonical form")
        except InvalidKeyError as exc:
            raise InvalidName(f"{name!r} decodes to an invalid key: {exc}") from None
        return ParsedName(key, key, None)
    readable, hex_digest = name[:mark], name[mark + len(HASH_MARK):]
    if not _HEX.fullmatch(hex_digest):
        raise InvalidName(f"{name!r} does not end in a {DIGEST_HEX}-digit digest")
    prefix = _unescape(readable)
    if readable and _escape(prefix.encode("utf-8")) != readable:
        raise InvalidName(f"{name!r} is not in canonical form")
    return ParsedName(None, prefix, hex_digest.decode("ascii"))


def name_to_key(name: bytes) -> str | None:
    """The key of a plain name; None for a hashed name (see :class:`HashedNames`)."""
    return parse_name(name).key


class HashedNames:
    """The keys behind recently listed or looked-up hashed names, so that ``ls`` then
    ``cat`` finds them without a search. Bounded (least recently used go first): a
    name that fell out is found again by listing its readable prefix."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[str, str] = OrderedDict()

    def note(self, key: str, name: bytes) -> None:
        """Remember ``key`` if ``name`` (its encoding) is hashed."""
        if is_hashed(name):
            tag = name[-DIGEST_HEX:].decode("ascii")
            self._keys[tag] = key
            self._keys.move_to_end(tag)
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)

    def get(self, parsed: ParsedName) -> str | None:
        if parsed.digest is None:
            return parsed.key
        key = self._keys.get(parsed.digest)
        if key is not None:
            self._keys.move_to_end(parsed.digest)
        return key

