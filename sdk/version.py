"""The SDK's version, and what a backend's declared target version means.

``SDK_VERSION`` is ``"MAJOR.MINOR"``. The compatibility policy (docs/sdk.md, "Versions"):

- a **minor** bump only adds: a new optional method with a default, a new field with a
  default, a new error subclass, a new kit check of a clause already written down. A
  backend written for ``1.x`` works unchanged on every ``1.y`` with ``y >= x``;
- a **major** bump may change or remove anything; a backend written for another major
  version is not expected to work.

A backend declares the version it was written for in the class attribute
``StorageBackend.sdk_version``; :func:`compatibility` says how that relates to this SDK.
This module is only the policy; the kit reports it (the ``sdk_version_declared`` check).
"""

from __future__ import annotations

import enum

SDK_VERSION = "1.2"


class Compatibility(enum.Enum):
    #: The backend targets exactly this SDK version.
    SAME = "same"
    #: The backend targets an older minor version of this major: it works unchanged.
    OLDER_MINOR = "older-minor"
    #: The backend targets a newer minor version: it may use what this SDK lacks.
    NEWER_MINOR = "newer-minor"
    #: The backend targets another major version: not expected to work.
    OTHER_MAJOR = "other-major"
    #: The backend declares no version, or one that is not ``MAJOR.MINOR``.
    UNDECLARED = "undeclared"


def parse_version(text: object) -> tuple[int, int] | None:
    """``"1.0"`` -> ``(1, 0)``; None for anything that is not ``MAJOR.MINOR``."""
    if not isinstance(text, str):
        return None
    major, sep, minor = text.partition(".")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def compatibility(declared: object, sdk: str = SDK_VERSION) -> Compatibility:
    """How a backend declaring ``declared`` relates to the SDK version ``sdk``."""
    theirs, ours = parse_version(declared), parse_version(sdk)
    assert ours is not None, f"SDK_VERSION {sdk!r} is not MAJOR.MINOR"
    if theirs is None:
        return Compatibility.UNDECLARED
    if theirs[0] != ours[0]:
        return Compatibility.OTHER_MAJOR
    if theirs[1] == ours[1]:
        return Compatibility.SAME
    return Compatibility.OLDER_MINOR if theirs[1] < ours[1] else Compatibility.NEWER_MINOR
