"""The SQLite ledger store: one file, many processes, under the broker's file-safety rules.

The file is only ever opened through SQLite, via the process-wide shared registry
(:mod:`sendonce._sqlite_share`): one connection per file per process, fork-safe,
transactions that an interruption cannot leave open.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, unquote, urlsplit

from .._sqlite_share import FileErrors, SharedHandle, creator, is_busy, open_shared
from ..errors import ConfigurationError, LedgerError
from ._store import Entry, Key

__all__ = ["SQLiteStore"]

FORMAT = "sendonce-ledger"
SCHEMA_VERSION = "1"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO ledger_meta VALUES
    ('format', '{FORMAT}'), ('schema_version', '{SCHEMA_VERSION}');
CREATE TABLE IF NOT EXISTS sendonce_ledger (
    entity TEXT NOT NULL,
    message_id TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    digest TEXT NOT NULL,
    first_attempt INTEGER NOT NULL,
    owner TEXT NOT NULL,
    confirmed_at INTEGER,
    outcome TEXT,
    PRIMARY KEY (entity, message_id, partition_key)
) WITHOUT ROWID;
"""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_CHUNK = 400  # keys per SELECT (two parameters each, under SQLite's 999 limit)
_COLUMNS = "message_id, partition_key, digest, first_attempt, owner, confirmed_at, outcome"


def _us(moment: datetime) -> int:
    return (moment - _EPOCH) // _US


def _time(value: int) -> datetime:
    return _EPOCH + value * _US


def _damaged(path: str, reason: str) -> Exception:
    return LedgerError(f"ledger file {path!r} {reason}")


def _storage(path: str, detail: str) -> Exception:
    return LedgerError(f"ledger file {path!r}: the disk refused a write ({detail}); nothing kept")


_ERRORS = FileErrors(damaged=_damaged, storage=_storage)


_create = creator(SCHEMA)  # an empty ledger, built aside and linked into place


def _configure(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA temp_store=MEMORY")


def _setup(path: str) -> object:
    def setup(conn: sqlite3.Connection, first: bool) -> None:
        try:
            rows = dict(conn.execute("SELECT key, value FROM ledger_meta").fetchall())
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise
            raise LedgerError(f"{path!r} is a SQLite database but not a sendonce ledger") from None
        if rows.get("format") != FORMAT:
            raise LedgerError(f"{path!r} is a SQLite database but not a sendonce ledger")
        if rows.get("schema_version") != SCHEMA_VERSION:
            raise LedgerError(
                f"{path!r} has ledger schema {rows.get('schema_version')!r}; "
                f"this sendonce reads {SCHEMA_VERSION!r}"
            )

    return setup


def _chunks(keys: Sequence[Key]) -> Iterator[Sequence[Key]]:
    for start in range(0, len(keys), _CHUNK):
        yield keys[start : start + _CHUNK]


def _select(conn: sqlite3.Connection, entity: str, keys: Sequence[Key]) -> dict[Key, Entry]:
    found: dict[Key, Entry] = {}
    for chunk in _chunks(keys):
        values = ",".join("(?,?)" for _ in chunk)
        params: list[object] = [entity]
        for key in chunk:
            params.extend(key)
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM sendonce_ledger WHERE entity = ? AND "
            f"(message_id, partition_key) IN (VALUES {values})",
            params,
        ).fetchall()
        for mid, pk, digest, first, owner, confirmed, outcome in rows:
            key = Key(mid, pk)
            found[key] = Entry(
                key,
                bytes.fromhex(digest),
                _time(first),
                owner,
                None if confirmed is None else _time(confirmed),
                outcome,
            )
    return found


def _packed_key(key: Key) -> str:
    """A key as one string SQL can split: partition key length (3 digits), key, id."""
    mid, pk = key
    return f"{len(pk):03d}{pk}{mid}"


# The columns of a packed key (``value`` of json_each): cheaper than JSON objects per row.
_PK_LEN = "CAST(substr(value, 1, 3) AS INTEGER)"
_UNPACK = f"substr(value, 4 + {_PK_LEN}), substr(value, 4, {_PK_LEN})"
# A packed intent: 16 hex digits of digest, then the packed key.
_I_PK_LEN = "CAST(substr(value, 17, 3) AS INTEGER)"
_INSERT = (
    "INSERT OR IGNORE INTO sendonce_ledger "
    "(entity, message_id, partition_key, digest, first_attempt, owner) "
    f"SELECT ?, substr(value, 20 + {_I_PK_LEN}), substr(value, 20, {_I_PK_LEN}), "
    "substr(value, 1, 16), ?, ? FROM json_each(?)"
)


def _apply_confirm(
    conn: sqlite3.Connection, entity: str, outcomes: Mapping[Key, str], at: datetime
) -> None:
    when = _us(at)
    by_outcome: dict[str, list[str]] = {}
    for (mid, pk), outcome in outcomes.items():
        by_outcome.setdefault(outcome, []).append(f"{len(pk):03d}{pk}{mid}")
    for outcome, packed in by_outcome.items():
        conn.execute(
            "UPDATE sendonce_ledger SET confirmed_at = ?, outcome = ? WHERE entity = ? AND "
            f"(message_id, partition_key) IN (SELECT {_UNPACK} FROM json_each(?))",
            (when, outcome, entity, json.dumps(packed)),
        )


class SQLiteStore:
    """Ledger rows in one SQLite file (WAL), shared safely by many processes."""

    def __init__(
        self, path: str, *, durability: str = "normal", busy_timeout: float = 60.0
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ConfigurationError("ledger path must be a non-empty str", field="ledger")
        if durability not in ("normal", "full"):
            raise ConfigurationError(
                'ledger durability must be "normal" (survives process crashes, like the '
                'broker\'s default) or "full" (also power loss)',
                field="durability",
            )
        real = os.path.abspath(path)
        self.path = real
        self.url = f"sqlite://{real}" + ("?durability=full" if durability == "full" else "")
        self.busy_timeout = busy_timeout
        self._handle: SharedHandle = open_shared(
            real,
            create=_create,
            setup=_setup(real),  # type: ignore[arg-type]
            configure=_configure,
            errors=_ERRORS,
            synchronous="FULL" if durability == "full" else "NORMAL",
            busy_timeout=busy_timeout,
        )

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        """``sqlite:///abs/path.db`` (or ``sqlite:relative.db``)."""
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"ledger url {url!r} names a host; use sqlite:///absolute/path.db", field="ledger"
            )
        path = unquote(parts.path)
        if not path or path.endswith("/"):
            raise ConfigurationError(f"ledger url {url!r} names no file", field="ledger")
        options = dict(parse_qsl(parts.query))
        unknown = set(options) - {"durability"}
        if unknown:
            raise ConfigurationError(
                f"ledger url {url!r}: unknown option(s) {sorted(unknown)}", field="ledger"
            )
        return cls(path, durability=options.get("durability", "normal"))

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    def _tx(self, work: object) -> object:
        return self._handle.transaction(
            work,  # type: ignore[arg-type]
            timeout=self.busy_timeout,
            on_busy=lambda text: LedgerError(f"ledger {text}"),
        )

    def record_intents(
        self,
        entity: str,
        intents: Sequence[Entry],
        *,
        confirm: Mapping[Key, str] | None = None,
        confirmed_at: datetime | None = None,
    ) -> dict[Key, Entry]:
        if not intents:
            return {}
        first = intents[0]
        packed = json.dumps([f"{e[1].hex()}{len(e[0][1]):03d}{e[0][1]}{e[0][0]}" for e in intents])

        def work(conn: sqlite3.Connection) -> dict[Key, Entry]:
            if confirm:
                _apply_confirm(conn, entity, confirm, confirmed_at or first.first_attempt)
            before = conn.total_changes
            conn.execute(_INSERT, (entity, _us(first.first_attempt), first.owner, packed))
            if conn.total_changes - before == len(intents):
                return {}  # every key was new: the common case costs no read
            return _select(conn, entity, [e.key for e in intents])

        result: dict[Key, Entry] = self._tx(work)  # type: ignore[assignment]
        return result

    def confirm(self, entity: str, outcomes: Mapping[Key, str], at: datetime) -> None:
        self._tx(lambda conn: _apply_confirm(conn, entity, outcomes, at))

    def release(self, entity: str, keys: Sequence[Key], owner: str) -> None:
        self._tx(
            lambda conn: conn.execute(
                "DELETE FROM sendonce_ledger WHERE entity = ? AND owner = ? AND "
                "confirmed_at IS NULL AND (message_id, partition_key) IN "
                f"(SELECT {_UNPACK} FROM json_each(?))",
                (entity, owner, json.dumps([_packed_key(k) for k in keys])),
            )
        )

    def lookup(self, entity: str, keys: Sequence[Key]) -> dict[Key, Entry]:
        result: dict[Key, Entry] = self._tx(lambda conn: _select(conn, entity, keys))  # type: ignore[assignment]
        return result

    def prune(self, before: datetime, limit: int) -> int:
        def work(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "DELETE FROM sendonce_ledger WHERE (entity, message_id, partition_key) IN ("
                "SELECT entity, message_id, partition_key FROM sendonce_ledger "
                "WHERE first_attempt < ? LIMIT ?)",
                (_us(before), limit),
            )
            return cursor.rowcount

        count: int = self._tx(work)  # type: ignore[assignment]
        return count

    def close(self) -> None:
        self._handle.close()
