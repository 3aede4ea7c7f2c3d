"""Opening a send ledger from the command line: one rule for ``publish --ledger`` and
``sendonce ledger``.

A ledger is named the same way everywhere: a url (``sqlite:///abs/ledger.db``,
``sqlite:rel/ledger.db``, ``postgresql://...``) or the bare path of a SQLite ledger
file. A ledger that does not exist is a decision, not a side effect: it is refused
(exit 2, naming its absolute path and the option that creates one) unless the
command was told to create it, because a typo'd path would start an empty ledger and
send every record again. A ledger the user may not write is read read-only, writing
nothing beside it. Failures follow ``publish``'s exit codes: a ledger that cannot be
reached (a PostgreSQL server down, a file locked by writers) exits 1; a ledger that
is not one, is missing, or is named wrongly exits 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal
from urllib.parse import unquote, urlsplit

import click

from ..errors import LedgerError, SendOnceError, ValidationError, redact
from ..ledger import InDoubtPolicy, Ledger, open_store
from ._files import os_errors, writable_problem
from ._words import CommandError, InputError, cli_text

__all__ = ["Mode", "ledger_url", "open_ledger", "sqlite_path"]

Mode = Literal["read", "write", "create"]
"""``read``: an existing ledger, read-only if the user may not write it; ``write``: an
existing ledger the user may write; ``create``: created if missing (said on stderr)."""

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def ledger_url(text: str, what: str) -> str:
    """The url ``text`` names: a ledger url as given, or a bare path as ``sqlite://ABS``.

    ``what`` is the option or argument (``--ledger``, ``LEDGER``) errors name.
    """
    text = text.strip()
    if not text:
        raise InputError(f"{what}: give a ledger url or the path of a SQLite ledger file")
    if text.startswith("sqlite:"):
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise InputError(
                f"{what}: ledger url {redact(text)!r} names a host ({parts.netloc!r}); a SQLite "
                "ledger is a local file: sqlite:///absolute/path.db, sqlite:relative.db or the "
                "file's path"
            )
        if not unquote(parts.path) or parts.path.endswith("/"):
            raise InputError(f"{what}: ledger url {redact(text)!r} names no file")
        return text
    if text.startswith(("postgresql://", "postgres://")):
        return text
    if _SCHEME.match(text) and not os.path.exists(text):
        raise InputError(
            f"{what}: ledger url {redact(text)!r} names no known store: use "
            "sqlite:///path/ledger.db (or the file's path) or postgresql://user@host/db"
        )
    return "sqlite://" + os.path.abspath(text)


def sqlite_path(url: str) -> str | None:
    """The absolute path of a SQLite ledger url, else None."""
    if not url.startswith("sqlite:"):
        return None
    path = unquote(urlsplit(url).path)
    return os.path.abspath(path) if path else None


def _missing(what: str, where: str, create_hint: str) -> InputError:
    return InputError(
        f"{what}: there is no ledger {where}. {create_hint}: a typo must not start an "
        "empty ledger, which would let every record be sent again"
    )


@contextmanager
def open_ledger(
    text: str,
    what: str,
    *,
    mode: Mode,
    create_hint: str,
    in_doubt: InDoubtPolicy = "error",
    created_by: str = "--create-ledger",
) -> Iterator[Ledger]:
    """The ledger ``text`` names, opened for ``mode``; every failure a CLI error.

    ``create_hint`` says what creates a missing ledger, in the command's words.
    A ledger created here is said on stderr with its absolute path.
    """
    url = ledger_url(text, what)
    path = sqlite_path(url)
    read_only = False
    if path is not None:
        if os.path.isdir(path):
            raise InputError(f"{what}: {path!r} is a directory, not a ledger file")
        exists = os.path.exists(path)
        if not exists and mode != "create":
            raise _missing(what, f"file {path!r}", create_hint)
        problem = writable_problem(path, f"{what}: ledger file", reading_only=mode == "read")
        if problem is not None:
            if mode != "read" or not exists or not os.access(path, os.R_OK):
                raise InputError(problem)
            read_only = True
            click.echo(
                f"note: you may not write {path} or beside it: reading it read-only "
                "(nothing is written beside it)",
                err=True,
            )
    ledger = _open(url, what, mode=mode, read_only=read_only, in_doubt=in_doubt, hint=create_hint)
    with ledger:
        if ledger.created:
            where = path if path is not None else redact(url)
            click.echo(f"note: created a new, empty ledger: {where} ({created_by})", err=True)
        try:
            yield ledger
        except ValidationError as exc:
            raise InputError(cli_text(exc)) from None
        except SendOnceError as exc:
            raise CommandError(f"{what} {redact(url)}: {cli_text(exc)}") from None


def _open(
    url: str, what: str, *, mode: Mode, read_only: bool, in_doubt: InDoubtPolicy, hint: str
) -> Ledger:
    sqlite = url.startswith("sqlite:")
    try:
        with os_errors(f"{what}: ledger file"):
            store = open_store(url, create=mode == "create", read_only=read_only)
    except ModuleNotFoundError as exc:
        name = (exc.name or "").split(".")[0]
        raise InputError(
            f"{what}: this store needs the {name} package: pip install 'sendonce[postgres]'"
        ) from None
    except ValidationError as exc:
        text = cli_text(exc)
        if "holds no sendonce ledger" in text:
            raise _missing(what, f"in database {redact(url)!r}", hint) from None
        raise InputError(f"{what}: {text}") from None
    except LedgerError as exc:
        text = f"{what} {redact(url)}: {cli_text(exc)}"
        if sqlite and "stayed locked" not in text:
            raise InputError(text) from None  # not a ledger, damaged: invalid, not transient
        raise CommandError(text) from None  # a server down, a file busy: try again later
    except SendOnceError as exc:
        raise CommandError(f"{what} {redact(url)}: {cli_text(exc)}") from None
    try:
        return Ledger(store, in_doubt=in_doubt)
    except BaseException:
        store.close()
        raise
