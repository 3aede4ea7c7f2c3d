"""Many messages of one shape held as columns, for the bulk paths.

A Spark task builds hundreds of thousands of messages that differ only in id,
keys and body. As :class:`Message` objects each costs about as much to build as
the local broker then spends taking it apart again. :class:`MessageColumns` is
an ordinary ``Sequence[Message]`` to anything that reads it as one (it builds
each message on first access, equal to what ``Message()`` gives); the sender's
transfer planning and the local broker read its columns instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any, overload

from ._ids import MAX_ID_LENGTH
from ._message import Message, MessageFactory

__all__ = ["MessageColumns"]


def _plain_texts(values: list[str]) -> bool:
    """``_message._plain_key`` for a whole column: every value a str of 1-128 ASCII
    characters without NUL, checked by a few C-level passes instead of a call per value."""
    if not values:
        return True
    if set(map(type, values)) != {str}:
        return False
    lengths = list(map(len, values))
    if min(lengths) < 1 or max(lengths) > MAX_ID_LENGTH:
        return False
    joined = "".join(values)
    return joined.isascii() and "\x00" not in joined


class MessageColumns(Sequence[Message]):
    """Messages sharing a :class:`MessageFactory`'s fields, as columns of ids, keys and bodies.

    Build with :meth:`of`, which returns None unless every message is one
    ``Message()`` would accept unchanged (then the caller builds objects, and
    ``Message()`` reports what is wrong). Slicing gives columns again.
    """

    __slots__ = (
        "_built",
        "bodies",
        "factory",
        "hashes",
        "message_ids",
        "partition_keys",
        "session_ids",
        "sizes",
    )

    def __init__(
        self,
        factory: MessageFactory,
        bodies: list[bytes],
        message_ids: list[str],
        partition_keys: list[str] | None,
        session_ids: list[str] | None,
        sizes: list[int],
        hashes: list[int],
    ) -> None:
        self.factory = factory
        self.bodies = bodies
        self.message_ids = message_ids
        self.partition_keys = partition_keys
        self.session_ids = session_ids
        self.sizes = sizes
        self.hashes = hashes
        self._built: list[Message] | None = None

    @classmethod
    def of(
        cls,
        factory: MessageFactory,
        bodies: list[Any],
        message_ids: list[str],
        partition_keys: list[str] | None = None,
        session_ids: list[str] | None = None,
    ) -> MessageColumns | None:
        """The columns as messages, or None if any message needs ``Message()``'s checks.

        Plain means: every body ``bytes``, every id and key 1-128 ASCII characters
        without NUL, and a message's partition key equal to its session id when both
        are set -- what ``MessageFactory`` assembles without checks.
        """
        if len(bodies) != len(message_ids) or not message_ids:
            return None
        if set(map(type, bodies)) != {bytes} or not _plain_texts(message_ids):
            return None
        for keys in (partition_keys, session_ids):
            if keys is not None and (len(keys) != len(message_ids) or not _plain_texts(keys)):
                return None
        if partition_keys is not None and session_ids is not None and partition_keys != session_ids:
            return None
        fixed = factory.fixed_size
        lengths = zip(map(len, bodies), map(len, message_ids), strict=True)
        sizes = [b + i + fixed for b, i in lengths]
        for keys in (partition_keys, session_ids):
            if keys is not None:
                sizes = [s + k for s, k in zip(sizes, map(len, keys), strict=True)]
        hashes = list(map(hash, bodies))
        return cls(factory, bodies, message_ids, partition_keys, session_ids, sizes, hashes)

    def __len__(self) -> int:
        return len(self.message_ids)

    def with_properties(self, extra: Mapping[str, str]) -> MessageColumns:
        """The same messages also carrying the text properties ``extra`` (trace context).

        Ids, keys and bodies are shared, so payload and duplicate checks see the same
        messages; ``extra`` must not name a property the factory already sets.
        """
        shared = self.factory
        props = dict(shared._constant or {})
        props.update(extra)
        factory = MessageFactory(
            subject=shared._subject,
            content_type=shared._content_type,
            application_properties=props,
        )
        grow = factory.fixed_size - shared.fixed_size
        return MessageColumns(
            factory,
            self.bodies,
            self.message_ids,
            self.partition_keys,
            self.session_ids,
            [size + grow for size in self.sizes],
            self.hashes,
        )

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> MessageColumns: ...

    def __getitem__(self, index: int | slice) -> Message | MessageColumns:
        if isinstance(index, slice):
            pks, sids = self.partition_keys, self.session_ids
            return MessageColumns(
                self.factory,
                self.bodies[index],
                self.message_ids[index],
                None if pks is None else pks[index],
                None if sids is None else sids[index],
                self.sizes[index],
                self.hashes[index],
            )
        if self._built is not None:
            return self._built[index]
        i = range(len(self.message_ids))[index]  # an IndexError like a list's
        pks, sids = self.partition_keys, self.session_ids
        return self.factory(
            self.bodies[i],
            self.message_ids[i],
            None if pks is None else pks[i],
            None if sids is None else sids[i],
        )

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def messages(self) -> list[Message]:
        """The messages as objects (built once, on first need)."""
        if self._built is None:
            n = len(self.message_ids)
            pks = repeat(None, n) if self.partition_keys is None else self.partition_keys
            sids = repeat(None, n) if self.session_ids is None else self.session_ids
            self._built = list(map(self.factory, self.bodies, self.message_ids, pks, sids))
        return self._built

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageColumns):
            return self.messages() == other.messages()
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return self.messages() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        first = repr(self.message_ids[0]) if self.message_ids else ""
        return f"MessageColumns({len(self)} messages, first {first})"
