"""The key prefix under which one engine instance keeps its KV cache in kvstored.

Two engine processes may share an object only when its bytes mean the same to both: the
same model, dtype, memory layout, page geometry and, for a tensor-parallel shard, the
same rank. A :class:`Namespace` spells all of that into the key, so ranks never collide
and a restart with another layout never reads bytes laid out for the old one; the page
hash the engine computes comes last. ``kvstore ls sglang/`` (or ``lmcache/``, ``vllm/``)
lists what an engine stored, one namespace per line of the prefix.

:attr:`Namespace.prefix` is also a kvstored namespace (docs/client.md): each adapter
registers its prefixes with the master when it starts, so ``kvstore status`` and the
master's metrics show each one's objects and bytes per tier, and ``kvstore rm --prefix``
(or ``batch_remove_prefix``) removes one whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvstored.protocol.master_api import NAMESPACE_SEPARATOR

#: Joins the parts of a namespace, and the namespace to the engine's hash: the master's
#: namespace separator, so that every prefix an adapter builds is a namespace it counts.
SEPARATOR = NAMESPACE_SEPARATOR


def escape_part(text: str) -> str:
    """``text`` made safe as one part: ``%`` and ``/`` percent-encoded, so two different
    part lists never give the same prefix (a model named ``org/name`` stays one part)."""
    return text.replace("%", "%25").replace(SEPARATOR, "%2F")


@dataclass(frozen=True, slots=True)
class Namespace:
    """An engine's key prefix: ``engine/part/part/.../``, each part escaped."""

    engine: str
    parts: tuple[str, ...]

    @classmethod
    def of(cls, engine: str, parts: Iterable[object]) -> Namespace:
        texts = tuple(str(part) for part in parts)
        empty = [i for i, text in enumerate(texts) if not text]
        if empty:
            raise ValueError(f"namespace part {empty[0]} of {engine} is empty: {texts!r}")
        return cls(engine, texts)

    @property
    def name(self) -> str:
        """The prefix without its trailing separator."""
        return SEPARATOR.join((escape_part(self.engine), *map(escape_part, self.parts)))

    @property
    def prefix(self) -> str:
        """What every key of this namespace starts with (``kvstore ls`` takes it)."""
        return self.name + SEPARATOR

    def key(self, engine_key: str) -> str:
        """The kvstored key of one engine key (a page or chunk hash), kept verbatim."""
        return self.prefix + engine_key

    def keys(self, engine_keys: Iterable[str]) -> list[str]:
        prefix = self.prefix
        return [prefix + key for key in engine_keys]


def dtype_name(dtype: object) -> str:
    """A torch (or numpy) dtype as a short stable name: ``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")
