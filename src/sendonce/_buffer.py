"""The bounded buffer between a caller's input and the transfers (a streamed ``send_many``).

A list, tuple or ``MessageColumns`` is already in the caller's memory: the sender plans it
whole. Any other iterable (a generator over a file, a cursor, a million rows) is read a
*chunk* at a time into a buffer of at most ``max_buffer_bytes``; the sender validates,
plans and sends one chunk (ledger intents, transfers, confirmations) before it reads the
next, so the input waits while the buffer is full (backpressure, like Kafka's
``buffer.memory``) and the call's memory stays the buffer plus its packed report,
whatever the input's length.

The first chunk is small (``FIRST_CHUNK`` messages) so the first transfer leaves within
milliseconds of the call; each next chunk may hold twice as many, up to the byte budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

from ._message import Message
from .errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_BUFFER_BYTES",
    "FIRST_CHUNK",
    "MESSAGE_FOOTPRINT",
    "Chunks",
    "check_buffer",
]

DEFAULT_MAX_BUFFER_BYTES = 32 * 1024 * 1024
"""The buffer's default budget (Kafka's ``buffer.memory`` default)."""
MESSAGE_FOOTPRINT = 1024
"""What a buffered message costs beyond its size: the Python objects of the message and
of its planning (transfer lists, id memory entry, ledger key, report entry), measured
with small messages (bench/bench_sender_memory.py)."""
FIRST_CHUNK = 256
"""Messages of the first chunk (then twice as many each chunk, within the budget)."""
MAX_CHUNK = 1 << 24
"""Messages of a chunk at most, whatever the budget (the count doubles only this far)."""
MIN_BUFFER_BYTES = 64 * 1024
"""The least budget accepted: one message of the largest size Service Bus takes must
fit, with room for a transfer's worth beside it."""


def check_buffer(value: object) -> int:
    """``max_buffer_bytes`` as given, or a ``ConfigurationError`` naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < MIN_BUFFER_BYTES:
        raise ConfigurationError(
            f"max_buffer_bytes must be an int >= {MIN_BUFFER_BYTES}, not {value!r}",
            field="max_buffer_bytes",
        )
    return value


class Chunks:
    """A caller's iterable read a chunk at a time within ``max_bytes``.

    ``read(most)`` reads up to ``most`` more messages into the chunk being filled and says
    whether it may take more (False: full, or the input is over); ``take()`` hands the
    chunk over with its first message's input position. Reading and taking are separate
    so that the aio sender can let other tasks run between reads.
    """

    __slots__ = ("_rows", "base", "bytes", "chunk", "exhausted", "limit", "max_bytes")

    def __init__(self, messages: Iterable[Message], max_bytes: int) -> None:
        self._rows: Iterator[Message] = iter(messages)
        self.max_bytes = max_bytes
        self.limit = FIRST_CHUNK
        self.chunk: list[Message] = []
        self.bytes = 0
        self.base = 0
        """The input position of the chunk's first message."""
        self.exhausted = False

    def read(self, most: int | None = None) -> bool:
        """Read up to ``most`` more messages into the chunk: whether it has room for more
        (False: full, by count or bytes, or the input is over)."""
        chunk = self.chunk
        room = self.limit - len(chunk)
        if most is not None:
            room = min(room, most)
        if room <= 0 or self.exhausted or self.bytes >= self.max_bytes:
            return False
        total, budget, append = self.bytes, self.max_bytes, chunk.append
        count = 0
        for message in islice(self._rows, room):
            append(message)
            count += 1
            size = getattr(message, "_size", 0)
            total += (size if isinstance(size, int) else 0) + MESSAGE_FOOTPRINT
            if total >= budget:
                break
        self.bytes = total
        if count < room and total < budget:
            self.exhausted = True
            return False
        return len(chunk) < self.limit and total < budget

    def fill(self) -> None:
        """Read until the chunk is full or the input is over (the sync sender)."""
        self.read()

    def take(self) -> tuple[list[Message], int]:
        """The chunk read so far and its first message's input position; the next may
        hold twice as many messages."""
        chunk, base = self.chunk, self.base
        self.chunk, self.bytes = [], 0
        self.base += len(chunk)
        self.limit = min(self.limit * 2, MAX_CHUNK)
        return chunk, base

    @property
    def done(self) -> bool:
        """Whether the whole input has been read and taken."""
        return self.exhausted and not self.chunk
