"""``AsyncBackend``: the asyncio half of the transfer seam, beside the sync one in
:mod:`sendonce.backends._base` (one module holds both, so they cannot drift apart)."""

from __future__ import annotations

from ..backends._base import AsyncBackend

__all__ = ["AsyncBackend"]
