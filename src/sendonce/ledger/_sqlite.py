"""The SQLite ledger store: one file, many processes, under the broker's file-safety rules.

The file is only ever opened through SQLite, via the process-wide shared registry
(:mod:`sendonce._sqlite_share`): one connection per file per process, fork-safe,
transactions that an interruption cannot leave open.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from .._names import ByName, name_key
from .._sqlite_share import FileErrors, SharedHandle, creator, is_busy, open_shared
from ..errors import ConfigurationError, LedgerError
from ._store import Confirmation, Entry, Key

T = TypeVar("T")

__all__ = ["SQLiteStore"]

FORMAT = "sendonce-ledger"
SCHEMA_VERSION = "3"
# Keys are one packed text each (entity id, ':', partition key length in 3 digits, the
# partition key, the message id) in a rowid table with a UNIQUE index: the dedup
# lookup and the insert are one index probe, as cheap as SQLite inserts get. The
# first attempt and owner of a transfer's intents live once in its transfer row,
# and so does the usual confirmation ("every intent of the transfer was acked"):
# one row written per transfer, not one per message. A key's own confirmed_at and
# outcome are set only where they differ (resent keys, partial transfers,
# duplicates). ``keys`` counts a transfer's remaining intents, so pruning can drop
# the transfer row with its last key.
_TABLES = """
CREATE TABLE IF NOT EXISTS ledger_entities (
    eid INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS ledger_transfers (
    tid INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL UNIQUE,
    first_attempt INTEGER NOT NULL,
    keys INTEGER NOT NULL DEFAULT 0,
    confirmed_at INTEGER,
    outcome TEXT
);
CREATE TABLE IF NOT EXISTS ledger_keys (
    k TEXT NOT NULL UNIQUE,
    tid INTEGER NOT NULL,
    digest TEXT NOT NULL,
    confirmed_at INTEGER,
    outcome TEXT
);
"""
# Version 3: entity names are case-insensitive, as on Service Bus and in the local
# broker: ``Orders`` and ``orders`` are one entity (one id), the name as first
# recorded is what the row keeps, and lookups compare ``name = ? COLLATE NOCASE``.
_NAMES_IGNORE_CASE = (
    "CREATE UNIQUE INDEX IF NOT EXISTS ledger_entities_name_nocase "
    "ON ledger_entities (name COLLATE NOCASE)"
)
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO ledger_meta VALUES
    ('format', '{FORMAT}'), ('schema_version', '{SCHEMA_VERSION}');
{_TABLES}
{_NAMES_IGNORE_CASE};
"""
# Version 1 kept one row per key with its own first attempt, owner and confirmation;
# each (owner, first attempt) of it becomes a transfer.
_UPGRADE_FROM_1 = [statement for statement in _TABLES.split(";") if statement.strip()] + [
    "INSERT INTO ledger_entities (name) SELECT DISTINCT entity FROM sendonce_ledger",
    "INSERT INTO ledger_transfers (owner, first_attempt, keys) "
    "SELECT owner || '@' || first_attempt, first_attempt, count(*) FROM sendonce_ledger "
    "GROUP BY owner, first_attempt ORDER BY first_attempt, owner",
    "INSERT INTO ledger_keys (k, tid, digest, confirmed_at, outcome) "
    "SELECT e.eid || ':' || printf('%03d', length(l.partition_key)) || l.partition_key "
    "|| l.message_id, t.tid, l.digest, l.confirmed_at, l.outcome FROM sendonce_ledger l "
    "JOIN ledger_entities e ON e.name = l.entity "
    "JOIN ledger_transfers t ON t.owner = l.owner || '@' || l.first_attempt ORDER BY t.tid",
    "DROP TABLE sendonce_ledger",
    "UPDATE ledger_meta SET value = '2' WHERE key = 'schema_version'",
]
# Whether an entity holds keys: those whose packed text starts with its id and ':'.
_HOLDS_KEYS = "SELECT EXISTS (SELECT 1 FROM ledger_keys WHERE k >= ?1 || ':' AND k < ?1 || ';')"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _us(moment: datetime) -> int:
    return (moment - _EPOCH) // _US


def _time(value: int) -> datetime:
    return _EPOCH + value * _US


def _damaged(path: str, reason: str) -> Exception:
    return LedgerError(f"ledger file {path!r} {reason}")


def _storage(path: str, detail: str) -> Exception:
    return LedgerError(f"ledger file {path!r}: the disk refused a write ({detail}); nothing kept")


_ERRORS = FileErrors(damaged=_damaged, storage=_storage, kind="ledger", field="ledger")


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
        version = rows.get("schema_version")
        if version in _UPGRADABLE and first:
            _upgrade(conn, path)
            version = SCHEMA_VERSION
        if version != SCHEMA_VERSION:
            raise LedgerError(
                f"{path!r} has ledger schema {version!r}; this sendonce reads "
                f"{SCHEMA_VERSION!r}"
                + (
                    " (it is upgraded when no other process has it open)"
                    if version in _UPGRADABLE
                    else ""
                )
            )

    return setup


_UPGRADABLE = ("1", "2")


def _upgrade(conn: sqlite3.Connection, path: str) -> None:
    """In place, in one transaction: readers of older versions are refused afterwards."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
        version = None if row is None else row[0]
        if version == "1":
            for statement in _UPGRADE_FROM_1:
                conn.execute(statement)
            version = "2"
        if version == "2":
            _one_entity_per_name(conn, path)
            conn.execute(_NAMES_IGNORE_CASE)
            conn.execute(
                "UPDATE ledger_meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,)
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _one_entity_per_name(conn: sqlite3.Connection, path: str) -> None:
    """Make names that differ only by case one entity's, before they become one name.

    A spelling that holds no keys (pruned, or never written) is only a name: it goes.
    Two spellings that both hold keys are refused, naming both: they name one entity
    on Service Bus, and which row wins where both hold a key is no upgrade's guess.
    """
    rows = conn.execute(
        "SELECT a.eid, a.name FROM ledger_entities AS a WHERE EXISTS (SELECT 1 FROM "
        "ledger_entities AS b WHERE b.name = a.name COLLATE NOCASE AND b.eid <> a.eid) "
        "ORDER BY a.eid"
    ).fetchall()
    spellings: dict[str, list[tuple[int, str]]] = {}
    for eid, name in rows:
        spellings.setdefault(name_key(name), []).append((eid, name))
    for names in spellings.values():
        holding = [
            (eid, name) for eid, name in names if conn.execute(_HOLDS_KEYS, (eid,)).fetchone()[0]
        ]
        if len(holding) > 1:
            raise LedgerError(
                f"ledger file {path!r} holds keys of entities {holding[0][1]!r} and "
                f"{holding[1][1]!r}, whose names differ only by case. From ledger schema "
                f"{SCHEMA_VERSION} entity names ignore case, as on Service Bus (where both "
                "name one entity), and this sendonce does not merge two names' keys: use the "
                "file with the sendonce version that wrote it until one name's keys are "
                "pruned (Ledger.prune after the retention), then open it again"
            )
        keep = holding[0][0] if holding else names[0][0]
        conn.executemany(
            "DELETE FROM ledger_entities WHERE eid = ?", [(eid,) for eid, _ in names if eid != keep]
        )


def _packer(eid: int) -> Callable[[Key], str]:
    prefix = f"{eid}:"

    def pack(key: Key) -> str:
        mid, pk = key
        return f"{prefix}{len(pk):03d}{pk}{mid}"

    return pack


_DIGEST_SIZE = 9
"""The size of a body digest the ledger writes (a format byte and xxh3-64)."""
_MESSAGE_ID = itemgetter(0)
_PARTITION_KEY = itemgetter(1)
# A transfer's keys, given as "digest/packed key" each in one JSON array.
_INSERT_PACKED = (
    "INSERT OR IGNORE INTO ledger_keys (k, tid, digest) "
    "SELECT substr(value, instr(value, '/') + 1), ?1, "
    "substr(value, 1, instr(value, '/') - 1) FROM json_each(?2)"
)
# The same keys: ?2 what each key's packing starts with ('' where ?4 holds packed keys),
# ?3 the digests' hex one after the other as a BLOB (substr of a BLOB counts bytes, at
# once; of a TEXT it walks characters from the start), ?4 the message ids (a JSON array).
_INSERT_SPREAD = (
    "INSERT OR IGNORE INTO ledger_keys (k, tid, digest) SELECT ?2 || value, ?1, "
    f"CAST(substr(?3, key * {2 * _DIGEST_SIZE} + 1, {2 * _DIGEST_SIZE}) AS TEXT) "
    "FROM json_each(?4)"
)


def _spread(pack: Callable[[Key], str], keys: Sequence[Key], digests: Sequence[bytes]) -> str:
    """``keys`` with their digests as one JSON array of "digest/packed key"."""
    return json.dumps(
        [f"{d.hex()}/{pack(k)}" for k, d in zip(keys, digests, strict=True)], ensure_ascii=False
    )


def _select(conn: sqlite3.Connection, packed: Mapping[str, Key]) -> dict[Key, Entry]:
    found: dict[Key, Entry] = {}
    rows = conn.execute(
        "SELECT k.k, k.digest, t.first_attempt, t.owner, coalesce(k.confirmed_at, "
        "t.confirmed_at), coalesce(k.outcome, t.outcome) FROM ledger_keys AS k "
        "JOIN ledger_transfers AS t ON t.tid = k.tid "
        "WHERE k.k IN (SELECT value FROM json_each(?))",
        (json.dumps(list(packed), ensure_ascii=False),),
    ).fetchall()
    for text, digest, first, owner, confirmed, outcome in rows:
        key = packed[text]
        found[key] = Entry(
            key,
            bytes.fromhex(digest),
            _time(first),
            owner,
            None if confirmed is None else _time(confirmed),
            outcome,
        )
    return found


_STAGED = "staged"
"""A transfer row's outcome while its intents are staged: written, never sent, not armed."""
_TAKEN = "taken"
"""A staged transfer some of whose intents another writer took over: it can no longer arm."""


def _take_staged(conn: sqlite3.Connection, tid: int, packed: str) -> int:
    """Move to transfer ``tid`` the keys of ``packed`` ("digest/key") that another writer
    staged and never armed, with the same digest; returns how many. Their writer's row
    becomes ``taken`` (its arm fails) and goes with its last key."""
    where = (
        "k.k IN (SELECT substr(value, instr(value, '/') + 1) FROM json_each(?1)) "
        "AND k.confirmed_at IS NULL AND k.tid != ?2 "
        "AND (k.digest || '/' || k.k) IN (SELECT value FROM json_each(?1)) "
        "AND t.outcome IN ('staged', 'taken')"
    )
    victims = conn.execute(
        "SELECT k.tid, count(*) FROM ledger_keys AS k "
        f"JOIN ledger_transfers AS t ON t.tid = k.tid WHERE {where} GROUP BY k.tid",
        (packed, tid),
    ).fetchall()
    if not victims:
        return 0
    moved = conn.execute(
        "UPDATE ledger_keys SET tid = ?2 WHERE k IN (SELECT k.k FROM ledger_keys AS k "
        f"JOIN ledger_transfers AS t ON t.tid = k.tid WHERE {where})",
        (packed, tid),
    ).rowcount
    for victim, lost in victims:
        conn.execute(
            "UPDATE ledger_transfers SET keys = keys - ?, outcome = ? WHERE tid = ?",
            (lost, _TAKEN, victim),
        )
        conn.execute("DELETE FROM ledger_transfers WHERE tid = ? AND keys <= 0", (victim,))
    return int(moved)


def _apply_confirm(
    conn: sqlite3.Connection, pack: Callable[[Key], str], confirmation: Confirmation, when: int
) -> None:
    transfers, keys = confirmation
    if transfers:
        conn.execute(
            "UPDATE ledger_transfers SET confirmed_at = ?, outcome = 'sent' "
            "WHERE owner IN (SELECT value FROM json_each(?)) AND confirmed_at IS NULL",
            (when, json.dumps(list(transfers), ensure_ascii=False)),
        )
    by_outcome: dict[str, list[str]] = {}
    for key, outcome in keys.items():
        by_outcome.setdefault(outcome, []).append(pack(key))
    for outcome, packed in by_outcome.items():
        conn.execute(
            "UPDATE ledger_keys SET confirmed_at = ?, outcome = ? "
            "WHERE k IN (SELECT value FROM json_each(?))",
            (when, outcome, json.dumps(packed, ensure_ascii=False)),
        )


class SQLiteStore:
    """Ledger rows in one SQLite file (WAL), shared safely by many processes."""

    def __init__(
        self,
        path: str,
        *,
        durability: str = "normal",
        busy_timeout: float = 60.0,
        create: bool = True,
        read_only: bool = False,
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
        directory = os.path.dirname(real)
        if not os.path.isdir(directory):
            raise ConfigurationError(
                f"ledger file {real!r}: its directory {directory!r} does not exist "
                "(create it first; the ledger creates only the file)",
                field="ledger",
            )
        if (read_only or not create) and not os.path.lexists(real):
            raise ConfigurationError(
                f"there is no ledger file {real!r}"
                + ("" if read_only else " (create=True starts a new, empty ledger there)"),
                field="ledger",
            )
        self.path = real
        self.url = f"sqlite://{real}" + ("?durability=full" if durability == "full" else "")
        self.busy_timeout = busy_timeout
        self.read_only = read_only
        self.created = False
        """Whether this open created the file (it did not exist)."""
        self._eids: ByName[int] = ByName()  # entity ids by name, any spelling

        def create_file(target: str) -> None:
            _create(target)
            self.created = True

        try:
            self._handle: SharedHandle = open_shared(
                real,
                create=create_file if create and not read_only else None,
                setup=_setup(real),  # type: ignore[arg-type]
                configure=_configure,
                errors=_ERRORS,
                synchronous="FULL" if durability == "full" else "NORMAL",
                busy_timeout=busy_timeout,
                read_only=read_only,
            )
        except ConfigurationError as exc:
            if exc.field != "path":
                raise
            raise ConfigurationError(str(exc), field="ledger") from None

    @classmethod
    def from_url(cls, url: str, *, create: bool = True, read_only: bool = False) -> SQLiteStore:
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
        return cls(
            path, durability=options.get("durability", "normal"), create=create, read_only=read_only
        )

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    def _tx(self, work: Callable[[sqlite3.Connection], T]) -> T:
        result: T = self._handle.transaction(
            work,
            timeout=self.busy_timeout,
            on_busy=lambda text: LedgerError(f"ledger {text}"),
        )
        return result

    def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in a read transaction (what a read-only store can do)."""
        result: T = self._handle.transaction(
            work,
            timeout=self.busy_timeout,
            on_busy=lambda text: LedgerError(f"ledger {text}"),
            immediate=False,
        )
        return result

    def _entity_id(self, entity: str) -> int:
        """The id of ``entity`` (any spelling of its name) in this file, created on first use."""
        eid = self._eids.get(entity)
        if eid is None:

            def work(conn: sqlite3.Connection) -> int:
                # Another spelling of the name already recorded is this entity (NOCASE index).
                conn.execute("INSERT OR IGNORE INTO ledger_entities (name) VALUES (?)", (entity,))
                row = conn.execute(
                    "SELECT eid FROM ledger_entities WHERE name = ? COLLATE NOCASE", (entity,)
                ).fetchone()
                return int(row[0])

            eid = self._tx(work)
            self._eids[entity] = eid  # only once committed: a rolled-back id is never kept
        return eid

    def record_intents(
        self,
        entity: str,
        keys: Sequence[Key],
        digests: Sequence[bytes],
        *,
        first_attempt: datetime,
        owner: str,
        confirm: Confirmation | None = None,
        staged: bool = False,
    ) -> dict[Key, Entry]:
        """See ``LedgerStore.record_intents``; ``staged``: see :meth:`arm` (``Ledger._arm``).

        Keys another writer staged and never armed, with the same body, are taken over
        (moved to this transfer, reported as new): that writer never sent them, and its
        arm now fails, so it never will.
        """
        if not keys:
            return {}
        eid = self._entity_id(entity)
        pack, prefix = _packer(eid), f"{eid}:"
        count = len(keys)
        joined = b"".join(digests)
        if len(joined) == _DIGEST_SIZE * count:
            # The usual write: digests of one size, as one hex string SQLite cuts (json_each's
            # ``key`` is the index); without partition keys the message ids go as one JSON
            # array too and SQLite packs each key: all built in C.
            if any(map(_PARTITION_KEY, keys)):
                head, ids = "", json.dumps(list(map(pack, keys)), ensure_ascii=False)
            else:
                head = f"{prefix}000"
                ids = json.dumps(list(map(_MESSAGE_ID, keys)), ensure_ascii=False)
            spread: tuple[object, ...] = (head, joined.hex().encode(), ids)
            spreading = _INSERT_SPREAD
        else:
            spread = (_spread(pack, keys, digests),)
            spreading = _INSERT_PACKED
        when = _us(first_attempt)

        def work(conn: sqlite3.Connection) -> dict[Key, Entry]:
            if confirm:
                _apply_confirm(conn, pack, confirm, when)
            tid = conn.execute(
                "INSERT INTO ledger_transfers (owner, first_attempt, outcome) VALUES (?, ?, ?) "
                "ON CONFLICT (owner) DO UPDATE SET owner = excluded.owner RETURNING tid",
                (owner, when, _STAGED if staged else None),
            ).fetchone()[0]
            inserted = conn.execute(spreading, (tid, *spread)).rowcount
            if inserted < count:
                inserted += _take_staged(conn, tid, _spread(pack, keys, digests))
            if inserted:
                conn.execute(
                    "UPDATE ledger_transfers SET keys = keys + ? WHERE tid = ?", (inserted, tid)
                )
            else:  # every key had a row: a transfer of nothing is not kept
                conn.execute("DELETE FROM ledger_transfers WHERE tid = ? AND keys = 0", (tid,))
            if inserted == count:
                return {}  # every key was new: the common case costs no read
            return _select(conn, {pack(k): Key(*k) for k in keys})

        return self._tx(work)

    def arm(self, entity: str, owner: str, confirm: Confirmation | None, at: datetime) -> bool:
        """Make ``owner``'s staged intents plain intents, with ``confirm``, in one transaction.

        A staged intent (``record_intents(..., staged=True)``) is one its writer has not
        sent yet and will not send before arming it: after a crash another writer takes
        it over, so it is never in doubt. False: some of them were taken over meanwhile
        (they are the taker's now; send none of them).
        """
        pack = _packer(self._entity_id(entity))

        def work(conn: sqlite3.Connection) -> bool:
            if confirm:
                _apply_confirm(conn, pack, confirm, _us(at))
            return bool(
                conn.execute(
                    "UPDATE ledger_transfers SET outcome = NULL WHERE owner = ? AND outcome = ?",
                    (owner, _STAGED),
                ).rowcount
            )

        return self._tx(work)

    def confirm(self, entity: str, confirmation: Confirmation, at: datetime) -> None:
        if not confirmation:
            return
        pack = _packer(self._entity_id(entity))
        self._tx(lambda conn: _apply_confirm(conn, pack, confirmation, _us(at)))

    def release(self, entity: str, keys: Sequence[Key], owner: str) -> None:
        if not keys:
            return
        pack = _packer(self._entity_id(entity))
        packed = json.dumps([pack(k) for k in keys], ensure_ascii=False)

        def work(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT tid, confirmed_at FROM ledger_transfers WHERE owner = ?", (owner,)
            ).fetchone()
            if row is None or row[1] is not None:
                return  # a confirmed transfer's keys are on the broker: never released
            deleted = conn.execute(
                "DELETE FROM ledger_keys WHERE tid = ? AND confirmed_at IS NULL AND "
                "k IN (SELECT value FROM json_each(?))",
                (row[0], packed),
            ).rowcount
            conn.execute(
                "UPDATE ledger_transfers SET keys = keys - ? WHERE tid = ?", (deleted, row[0])
            )

        self._tx(work)

    def lookup(self, entity: str, keys: Sequence[Key]) -> dict[Key, Entry]:
        if not keys:
            return {}
        if self.read_only:  # the entity's id is only read, never created
            eid = self._eids.get(entity)
            if eid is None:
                row = self.read(
                    lambda conn: conn.execute(
                        "SELECT eid FROM ledger_entities WHERE name = ? COLLATE NOCASE", (entity,)
                    ).fetchone()
                )
                if row is None:
                    return {}
                eid = self._eids[entity] = int(row[0])
            pack = _packer(eid)
            packed = {pack(k): Key(*k) for k in keys}
            return self.read(lambda conn: _select(conn, packed))
        pack = _packer(self._entity_id(entity))
        packed = {pack(k): Key(*k) for k in keys}
        return self._tx(lambda conn: _select(conn, packed))

    def prune(self, before: datetime, limit: int) -> int:
        """The oldest-written keys first: at most ``limit`` read, only the old ones deleted.

        A younger key written earlier (clocks differ between producers) holds pruning
        back until it ages: a key younger than the retention is never removed.
        """

        def work(conn: sqlite3.Connection) -> int:
            victims = conn.execute(
                "SELECT k.rowid, k.tid FROM (SELECT rowid, tid FROM ledger_keys "
                "ORDER BY rowid LIMIT ?) AS k JOIN ledger_transfers AS t ON t.tid = k.tid "
                "WHERE t.first_attempt < ?",
                (limit, _us(before)),
            ).fetchall()
            if not victims:
                return 0
            per_transfer: dict[int, int] = {}
            for _rowid, tid in victims:
                per_transfer[tid] = per_transfer.get(tid, 0) + 1
            conn.execute(
                "DELETE FROM ledger_keys WHERE rowid IN (SELECT value FROM json_each(?))",
                (json.dumps([rowid for rowid, _tid in victims]),),
            )
            conn.executemany(
                "UPDATE ledger_transfers SET keys = keys - ? WHERE tid = ?",
                [(n, tid) for tid, n in per_transfer.items()],
            )
            conn.execute(
                "DELETE FROM ledger_transfers WHERE keys <= 0 AND tid IN "
                "(SELECT value FROM json_each(?))",
                (json.dumps(list(per_transfer)),),
            )
            return len(victims)

        return self._tx(work)

    def close(self) -> None:
        self._handle.close()
