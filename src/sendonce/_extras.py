"""Optional extras: an import that needs one names the ``pip install`` that provides it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["EXTRA_OF_MODULE", "requires_extra"]

# Top-level modules of the optional dependencies, and the extra that installs each.
EXTRA_OF_MODULE = {
    "azure": "azure",
    "aiohttp": "aio",
    "proton": "emulator",
    "cproton": "emulator",
    "pyspark": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "psycopg": "postgres",
    "opentelemetry": "otel",
}


def hint(what: str, extra: str) -> str:
    """The sentence telling a user which extra to install."""
    return f"{what} needs the {extra!r} extra: pip install 'sendonce[{extra}]'"


@contextmanager
def requires_extra(what: str, extra: str) -> Iterator[None]:
    """Turn a missing optional dependency into a ``ModuleNotFoundError`` naming ``extra``.

    A missing module of sendonce itself, or one no extra provides, passes unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in EXTRA_OF_MODULE:
            raise
        needed = EXTRA_OF_MODULE[top] if extra == "auto" else extra
        raise ModuleNotFoundError(
            f"{hint(what, needed)} (module {exc.name!r} is not installed)", name=exc.name
        ) from None
