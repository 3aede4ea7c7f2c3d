"""The PostgreSQL ledger's key column (schema 3): one packed ``bytea`` per key.

Kept apart from the store (which needs psycopg) because the inspection queries read it
too. ``k`` packs (entity, partition key, message id): the entity's UTF-8 bytes and the
partition key's, each after its length in two bytes (big-endian), then the message id's.
The lengths make the packing injective (two distinct keys never pack to the same bytes:
read the entity's length, then the entity, the partition key's length, the partition
key, and the rest is the message id, so the bytes give back the one key they came from)
and the entity part self-delimiting, so an entity's keys are one range of the index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import ConfigurationError
from ._store import Key

__all__ = [
    "ENTITY_SQL",
    "IN_ENTITY_SQL",
    "KEY_ORDER_SQL",
    "entity_prefix",
    "entity_range",
    "packed_key",
    "packed_keys",
    "unpack_key",
]

# The parts of a packed key in SQL (get_byte counts from 0, substring from 1).
_E_LEN = "(get_byte(l.k, 0) * 256 + get_byte(l.k, 1))"
_P_LEN = f"(get_byte(l.k, 2 + {_E_LEN}) * 256 + get_byte(l.k, 3 + {_E_LEN}))"
_P_BYTES = f"substring(l.k from 5 + {_E_LEN} for {_P_LEN})"
_M_BYTES = f"substring(l.k from 5 + {_E_LEN} + {_P_LEN})"
ENTITY_SQL = f"convert_from(substring(l.k from 3 for {_E_LEN}), 'UTF8')"
"""SQL: the entity name (folded) of the packed key ``l.k``."""
KEY_ORDER_SQL = f"{_M_BYTES}, {_P_BYTES}"
"""SQL: message id, then partition key, by code point (their UTF-8 bytes), of ``l.k``."""
IN_ENTITY_SQL = "l.k >= %(lo)s AND l.k < %(hi)s"
"""SQL: ``l.k`` is a key of the entity whose :func:`entity_range` is ``lo``, ``hi``."""

_UNPARTITIONED = b"\x00\x00"
"""An empty partition key's part of a packed key: its length, zero."""


def entity_prefix(entity: str) -> bytes:
    """What every packed key of ``entity`` (its folded name) starts with."""
    name = entity.encode()
    if len(name) > 0xFFFF:
        raise ConfigurationError(
            f"entity name {entity[:40]!r}... is too long for the ledger", field="entity"
        )
    return len(name).to_bytes(2, "big") + name


def entity_range(entity: str) -> dict[str, bytes]:
    """``lo`` and ``hi``: the packed keys of ``entity`` (folded) are those in [lo, hi)."""
    lo = entity_prefix(entity)
    # lo names its own length, so no other entity's keys start with it; the first bytes
    # after every key starting with lo: lo with its last byte raised by one (carried).
    head = lo.rstrip(b"\xff")
    hi = head[:-1] + bytes([head[-1] + 1])
    return {"lo": lo, "hi": hi}


def packed_key(entity: str, key: Key) -> bytes:
    """The version-3 key column of ``key`` of ``entity`` (its folded name: ``name_key``).

    Injective: the entity and partition key are each preceded by their length, so two
    distinct (entity, partition key, message id) never pack to the same bytes.
    """
    return _packer(entity_prefix(entity))(key)


def _packer(prefix: bytes) -> Callable[[Key], bytes]:
    plain = prefix + _UNPARTITIONED

    def pack(key: Key) -> bytes:
        mid, pk = key
        if not pk:
            return plain + mid.encode()
        part = pk.encode()
        if len(part) > 0xFFFF:
            raise ConfigurationError(
                f"partition key {pk[:40]!r}... is too long for the ledger", field="partition_key"
            )
        return prefix + len(part).to_bytes(2, "big") + part + mid.encode()

    return pack


def unpack_key(packed: bytes) -> Key:
    """The message id and partition key of a packed key (the inverse of :func:`packed_key`)."""
    packed = bytes(packed)
    at = 2 + int.from_bytes(packed[:2], "big")
    length = int.from_bytes(packed[at : at + 2], "big")
    return Key(packed[at + 2 + length :].decode(), packed[at + 2 : at + 2 + length].decode())


def packed_keys(entity: str, keys: Sequence[Key]) -> list[bytes]:
    """The packed keys of ``keys`` of ``entity`` (folded), in one pass."""
    prefix = entity_prefix(entity)
    if all(not pk for _mid, pk in keys):
        plain = prefix + _UNPARTITIONED
        return [plain + mid.encode() for mid, _pk in keys]
    pack = _packer(prefix)
    return [pack(k) for k in keys]
