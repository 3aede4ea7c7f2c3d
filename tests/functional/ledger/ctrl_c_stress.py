"""Ctrl-C while a sync ``send_many`` waits for an intent write behind a row lock, many times.

Issue 34, finding 15: a sync ``send_many`` with a PostgreSQL ledger (batches of 20, 60
messages, an entity without duplicate detection) got SIGINT while its second transfer's
intent write waited for another transaction's row lock, released 0.5 s later; about once in
20 runs the call returned normally, as if no Ctrl-C had come. Each run here sets that up,
waits for the event (PostgreSQL shows the sender's INSERT waiting for the lock), sends SIGINT
to this process as a terminal would (to the process, not to a thread), releases the lock
0.5 s later, and records how the call ended. One JSON line per run on stdout, then a summary.

    python ctrl_c_stress.py POSTGRES_URL BROKER_FILE RUNS
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import psycopg

from sendonce import EntityProfile, IdempotentSender, Ledger, Message
from sendonce.backends.local import LocalBackend
from sendonce.ledger import Key
from sendonce.ledger._pgkeys import packed_key

BATCH, MESSAGES, BLOCKED = 20, 60, "m-25"  # BLOCKED: a key of the second transfer
IN_FLIGHT = (1, 4)  # runs alternate: transfers one at a time (inline) or in flight (a pool)
WAITING = """
SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%%INSERT INTO sendonce_ledger%%'
    AND datname = current_database()
"""


def one_run(url: str, broker: LocalBackend, ledger: Ledger, run: int) -> dict[str, object]:
    entity = f"audit{run}"
    profile = EntityProfile(entity, duplicate_detection=False)
    broker.create_entity(profile)
    blocker = psycopg.connect(url)  # a transaction of its own, holding the key's row lock
    blocker.execute(
        "INSERT INTO sendonce_ledger (k, digest, first_attempt, owner) "
        "VALUES (%s, '\\x00', now(), 'blocker')",
        (packed_key(entity, Key(BLOCKED)),),
    )
    happened: dict[str, object] = {}  # never_waited: the scenario did not happen

    def interrupt() -> None:
        with psycopg.connect(url, autocommit=True) as watch:
            deadline = time.monotonic() + 120
            while not watch.execute(WAITING).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    happened["never_waited"] = True
                    break
                time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C: to the process
        time.sleep(0.5)  # the scenario: the other transaction ends 0.5 s later
        blocker.rollback()

    messages = [Message(f"body {i}", message_id=f"m-{i}") for i in range(MESSAGES)]
    helper = threading.Thread(target=interrupt)
    outcome = "returned"
    in_flight = IN_FLIGHT[run % len(IN_FLIGHT)]
    sender = IdempotentSender(
        broker, profile, ledger=ledger, max_batch_messages=BATCH, max_in_flight=in_flight
    )
    try:
        helper.start()
        try:
            sender.send_many(messages)
        except KeyboardInterrupt:
            outcome = "interrupted"
        except Exception as exc:  # reported, not hidden
            outcome = f"raised {type(exc).__name__}: {exc}"
        # The signal may still be on its way (it was sent after the call returned): let it
        # land here, where it is counted, not in the next run.
        try:
            helper.join()
        except KeyboardInterrupt:
            outcome += " (then interrupted)"
        try:
            time.sleep(0.05)
        except KeyboardInterrupt:
            outcome += " (then interrupted)"
    finally:
        sender.close()
        blocker.close()
    return {"run": run, "in_flight": in_flight, "outcome": outcome, **happened}


def main() -> int:
    url, broker_file, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    counts: dict[str, int] = {}
    with LocalBackend(broker_file) as broker, Ledger(url) as ledger:
        for run in range(runs):
            line = one_run(url, broker, ledger, run)
            print(json.dumps(line), flush=True)
            counts[str(line["outcome"])] = counts.get(str(line["outcome"]), 0) + 1
    print(json.dumps({"summary": counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
