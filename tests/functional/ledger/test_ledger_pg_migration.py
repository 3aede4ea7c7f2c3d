"""PostgreSQL ledger schema 2 -> 3 (keys packed in one bytea column), on a real cluster.

A database of schema 2 holds keys in every state (confirmed by their transfer's row, by
their own row, by hand; unconfirmed inside and past the window; staged, taken; a legacy
digest; partitioned keys with non-ASCII parts): after the first open upgrades it, every
key reads back the same, the same keys are in doubt, and a re-run decides each as before
the upgrade would have (nothing in doubt is resent). A producer of schema 2 mid-write
when the upgrade starts commits first and its intent is kept; one writing afterwards
fails instead of writing where this version does not read.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from ledger_helpers import T0, WINDOW, Clock

from sendonce import EntityProfile, IdempotentSender, Ledger, Message, RetryPolicy
from sendonce.backends import LocalBackend
from sendonce.errors import InDoubtError
from sendonce.ledger import InDoubtRule, Key, body_digest
from sendonce.ledger._inspect import count_unconfirmed, entity_counts, unconfirmed
from sendonce.ledger._pgkeys import packed_key
from sendonce.ledger._postgres import _SCHEMA_2, _STAGED_TABLE, PostgresStore, _joined

pytestmark = pytest.mark.postgres

LONG_AGO = T0 - 2 * WINDOW  # past every window at T0
RECENT = T0 - timedelta(minutes=1)  # inside the orders window at T0


def body(mid: str) -> str:
    return f"body of {mid}"


# (entity, message id, partition key, first attempt, owner, own confirmation, outcome)
# and what it is: every state a key of schema 2 can be in.
ROWS: list[tuple[str, str, str, Any, str, Any, str | None, str]] = [
    ("orders", "o-transfer", "", LONG_AGO, "t-acked", None, None, "confirmed (transfer row)"),
    ("orders", "o-dup", "", LONG_AGO, "t-open", LONG_AGO, "duplicate", "confirmed (own row)"),
    ("orders", "o-resolved", "", LONG_AGO, "t-open", T0, "resolved", "confirmed by hand"),
    ("orders", "o-old", "", LONG_AGO, "t-open", None, None, "unconfirmed, window passed"),
    ("orders", "o-young", "", RECENT, "t-young", None, None, "unconfirmed, inside window"),
    ("orders", "o-staged", "", LONG_AGO, "t-staged", None, None, "staged, not armed"),
    ("orders", "o-taken", "", LONG_AGO, "t-taken", None, None, "staged, taken over"),
    ("orders", "ördér-1", "clé é", LONG_AGO, "t-acked", None, None, "non-ASCII, partitioned"),
    ("orders", "a", "bc", LONG_AGO, "t-open", None, None, "partitioned (a/bc)"),
    ("orders", "ca", "b", LONG_AGO, "t-open", None, None, "partitioned (ca/b): no clash"),
    ("audit", "a-open", "", LONG_AGO, "t-audit", None, None, "no dedup: in doubt at once"),
    ("audit", "a-legacy", "", LONG_AGO, "t-legacy", LONG_AGO, "sent", "8-byte legacy digest"),
]


def _digest(mid: str) -> bytes:
    message = Message(body(mid), message_id=mid)
    if mid == "a-legacy":
        import hashlib

        return hashlib.blake2b(body(mid).encode(), digest_size=8).digest()
    return body_digest(message)


def _schema_2(url: str) -> None:
    """A ledger as sendonce wrote schema 2 (with its staged-transfers table)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_SCHEMA_2)
        conn.execute(_STAGED_TABLE)
        conn.execute("INSERT INTO sendonce_ledger_meta VALUES ('schema_version', '2')")
        for entity, mid, pk, first, owner, confirmed, outcome, _what in ROWS:
            conn.execute(
                "INSERT INTO sendonce_ledger VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (entity, mid, pk, _digest(mid), first, owner, confirmed, outcome),
            )
        conn.execute(
            "INSERT INTO sendonce_ledger_transfers VALUES ('orders', 't-acked', %s)", (LONG_AGO,)
        )
        conn.execute(
            "INSERT INTO sendonce_ledger_staged VALUES ('orders', 't-staged', %s, false), "
            "('orders', 't-taken', %s, true)",
            (LONG_AGO, LONG_AGO),
        )


def _expected() -> dict[tuple[str, Key], tuple[object, ...]]:
    """Each key's row as schema 2 read it (transfer rows and staged marks applied)."""
    rows: dict[tuple[str, Key], tuple[object, ...]] = {}
    for entity, mid, pk, first, owner, confirmed, outcome, _what in ROWS:
        if owner == "t-acked" and confirmed is None:
            confirmed, outcome = LONG_AGO, "sent"
        elif owner == "t-staged":
            outcome = "staged"
        elif owner == "t-taken":
            outcome = "taken"
        rows[entity, Key(mid, pk)] = (_digest(mid), first, owner, confirmed, outcome)
    return rows


def _read(store: PostgresStore) -> dict[tuple[str, Key], tuple[object, ...]]:
    found: dict[tuple[str, Key], tuple[object, ...]] = {}
    for entity in ("orders", "audit"):
        keys = [Key(mid, pk) for e, mid, pk, *_ in ROWS if e == entity]
        for key, row in store.lookup(entity.upper(), keys).items():  # any spelling
            assert row.key == key
            found[entity, key] = (
                row.digest,
                row.first_attempt,
                row.owner,
                row.confirmed_at,
                row.outcome,
            )
    return found


@pytest.fixture
def pg_url(postgres_database: Any) -> str:
    url: str = postgres_database()
    return url


def _version(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM sendonce_ledger_meta").fetchone()
        assert row is not None
        return str(row[0])


def test_every_key_reads_the_same_after_the_upgrade(pg_url: str) -> None:
    _schema_2(pg_url)
    store = PostgresStore(pg_url)
    try:
        assert _version(pg_url) == "3"
        assert _read(store) == _expected()
        # the same keys in doubt: staged ones never, confirmed ones never
        in_doubt = {u.key for u in unconfirmed(store, "orders")}
        assert in_doubt == {Key("o-old"), Key("o-young"), Key("a", "bc"), Key("ca", "b")}
        assert count_unconfirmed(store, "orders") == 4
        rule = InDoubtRule.of(EntityProfile("orders"))
        past = {u.key for u in unconfirmed(store, "orders", before=rule.cutoff(T0))}
        assert past == in_doubt - {Key("o-young")}
        assert [u.key for u in unconfirmed(store, "audit")] == [Key("a-open")]
        counts = {c.entity: (c.keys, c.confirmed) for c in entity_counts(store)}
        assert counts == {"orders": (8, 4), "audit": (2, 1)}  # staged keys left out
    finally:
        store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = conn.execute("SELECT to_regclass('sendonce_ledger_v2')").fetchone()
        assert tables == (None,)  # the old table is gone, not left beside
        with pytest.raises(psycopg.errors.UndefinedColumn):  # a schema-2 producer's write
            conn.execute(
                "INSERT INTO sendonce_ledger (entity, message_id, partition_key, digest, "
                "first_attempt, owner) VALUES ('orders', 'x', '', '\\x01', now(), 'old')"
            )


def test_partitioned_keys_are_decided_as_before_after_the_upgrade(
    pg_url: str, tmp_path: Path
) -> None:
    """A confirmed partitioned key (non-ASCII parts) is skipped, the unconfirmed ones past
    the window stay in doubt (not sent); on an entity without duplicate detection too."""
    _schema_2(pg_url)
    clock = Clock()
    retry = RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)
    orders = EntityProfile("orders", partitioned=True)
    audit = EntityProfile("audit", duplicate_detection=False)
    with (
        LocalBackend(tmp_path / "broker.db", clock=clock) as broker,
        Ledger(pg_url, clock=clock) as ledger,
    ):
        broker.create_entity(orders)
        broker.create_entity(audit)
        with IdempotentSender(broker, orders, ledger=ledger, retry=retry) as sender:
            report = sender.send_many(
                [
                    Message(body(mid), message_id=mid, partition_key=pk)
                    for e, mid, pk, *_ in ROWS
                    if e == "orders" and pk
                ]
            )
        with IdempotentSender(broker, audit, ledger=ledger, retry=retry) as sender:
            audit_report = sender.send_many(
                [Message(body(m), message_id=m) for m in ("a-open", "a-legacy")]
            )
        stored = broker.count("orders") + broker.count("audit")
        # what an operator reads and settles: the same keys, from the packed column
        assert [u.key for u in ledger.keys_in_doubt("audit", audit)] == [Key("a-open")]
        assert {u.key for u in ledger.keys_in_doubt("orders", orders)} == {
            Key("o-old"),
            Key("a", "bc"),
            Key("ca", "b"),
        }
        found = ledger.reconcile(
            broker, "audit", apply=True, release_absent=True, min_age=timedelta(0)
        )
        assert [v.item.key for v in found.verdicts] == [Key("a-open")]
        assert found.to_release == (Key("a-open"),) and found.applied  # the broker lacks it
        assert ledger.keys_in_doubt("audit", audit) == []
    assert report.from_ledger == ["ördér-1"] and report.sent == 0
    assert sorted(f.message_id for f in report.failures) == ["a", "ca"]
    assert all(isinstance(f.error, InDoubtError) for f in report.failures)
    assert audit_report.from_ledger == ["a-legacy"] and audit_report.sent == 0
    assert [f.message_id for f in audit_report.failures] == ["a-open"]
    assert isinstance(audit_report.failures[0].error, InDoubtError)
    assert stored == 0


def test_unpartitioned_keys_in_each_state_are_decided_as_before(
    pg_url: str, tmp_path: Path
) -> None:
    _schema_2(pg_url)
    clock = Clock()
    retry = RetryPolicy(initial_backoff=0, max_backoff=0, jitter=False, sleep=lambda s: None)
    orders = EntityProfile("orders")
    with (
        LocalBackend(tmp_path / "broker.db", clock=clock) as broker,
        Ledger(pg_url, clock=clock) as ledger,
    ):
        broker.create_entity(orders)
        mids = [mid for e, mid, pk, *_ in ROWS if e == "orders" and not pk]
        with IdempotentSender(broker, orders, ledger=ledger, retry=retry) as sender:
            report = sender.send_many([Message(body(m), message_id=m) for m in mids])
        stored = broker.count("orders")
    assert sorted(report.from_ledger) == ["o-dup", "o-resolved", "o-transfer"]
    assert [f.message_id for f in report.failures] == ["o-old"]  # in doubt: not resent
    assert isinstance(report.failures[0].error, InDoubtError)
    # sent: the young key (inside its window) and the staged ones (never sent before)
    assert sorted(r.message_id for r in report.results if r.outcome == "sent") == [
        "o-staged",
        "o-taken",
        "o-young",
    ]
    assert stored == 3


def test_a_schema_2_producer_mid_write_commits_first_and_its_intent_is_kept(
    pg_url: str,
) -> None:
    """The upgrade waits for an open write of the old layout, then copies it."""
    _schema_2(pg_url)
    opened: list[PostgresStore] = []
    failed: list[BaseException] = []
    with (
        psycopg.connect(pg_url) as writer,
        psycopg.connect(pg_url, autocommit=True) as admin,
    ):
        writer.execute(
            "INSERT INTO sendonce_ledger VALUES ('orders', 'late', '', %s, %s, 'w', NULL, NULL)",
            (_digest("late"), T0),
        )  # not committed: the producer of schema 2 is mid-write

        def open_store() -> None:
            try:
                opened.append(PostgresStore(pg_url))
            except BaseException as exc:
                failed.append(exc)

        opener = threading.Thread(target=open_store)
        opener.start()
        while opener.is_alive():  # wait for the event: the upgrade waits for the lock
            row = admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
            if row is not None and row[0]:
                break
            opener.join(0.01)
        assert opener.is_alive(), "the upgrade did not wait for the open write"
        writer.commit()
        opener.join()
    assert not failed, failed
    [store] = opened
    try:
        [row] = store.lookup("orders", [Key("late")]).values()
        assert (row.owner, row.first_attempt, row.confirmed_at) == ("w", T0, None)
    finally:
        store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        packed = conn.execute("SELECT k FROM sendonce_ledger WHERE owner = 'w'").fetchone()
    assert packed == (packed_key("orders", Key("late")),)


def test_both_intent_statements_pack_keys_as_python_does(pg_url: str) -> None:
    """Schema 3's usual write sends ids and partition keys as two joined texts and the
    server packs them; a key holding the separator goes as arrays packed in Python: the
    rows are the same, and each key is found by its Python packing."""
    store = PostgresStore(pg_url)
    at = T0
    joined = [Key("ördér-1", "clé é"), Key("b"), Key("c", "p"), Key("d", "")]
    solo = [Key("solo")]  # one key without a partition key: an empty joined text
    arrays = [Key("with\x1fseparator"), Key("e", "x\x1fy")]
    try:
        for owner, keys in (("j", joined), ("s", solo), ("a", arrays)):
            digests = [_digest(k.message_id) for k in keys]
            assert (_joined(keys, digests) is None) == (owner == "a")  # which statement
            assert (
                store.record_intents("Orders", keys, digests, first_attempt=at, owner=owner) == {}
            )
        every = [*joined, *solo, *arrays]
        found = store.lookup("orders", every)
        assert sorted(found) == sorted(every)
        assert all(found[k].digest == _digest(k.message_id) for k in every)
        again = store.record_intents(
            "orders", every, [_digest(k.message_id) for k in every], first_attempt=at, owner="z"
        )
        assert {k: e.owner for k, e in again.items()} == {k: found[k].owner for k in every}
    finally:
        store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = {bytes(k) for (k,) in conn.execute("SELECT k FROM sendonce_ledger").fetchall()}
    assert rows == {packed_key("orders", k) for k in every}
