"""The embedded local broker (placeholder until the store lands)."""

from __future__ import annotations

from typing import Any


class LocalBackend:  # pragma: no cover - replaced by the real store
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("LocalBackend is being built")


class ReceivedMessage:  # pragma: no cover
    pass


__all__ = ["LocalBackend", "ReceivedMessage"]
