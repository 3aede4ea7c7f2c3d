"""A relay process that dies (``os._exit(9)``, as ``kill -9`` would) right after the broker
accepted its first transfer: before the sender hears the ack, so before the ledger's
confirmation and the outbox row's mark. Other transfers in flight at that moment may or may
not have reached the broker.

``python crashing_relay.py OUTBOX BROKER_URL ENTITY ID_CACHE_SIZE [LEDGER]``
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from sendonce import EntityProfile
from sendonce.backends.artemis import ArtemisBackend
from sendonce.outbox import Relay


def main() -> None:
    outbox, broker, entity, cache = sys.argv[1:5]
    ledger = sys.argv[5] if len(sys.argv) > 5 else None
    send = ArtemisBackend.send

    def send_then_die(self: ArtemisBackend, *args: object, **kwargs: object) -> object:
        send(self, *args, **kwargs)  # type: ignore[arg-type]
        os._exit(9)

    submit = ArtemisBackend.submit

    def submit_then_die(self: ArtemisBackend, *args: object, **kwargs: object) -> object:
        # The engine drives Artemis through its native submit: die once the broker has
        # answered a transfer, before the relay hears of it and marks its rows.
        future = submit(self, *args, **kwargs)  # type: ignore[arg-type]
        future.add_done_callback(lambda done: done.exception() is None and os._exit(9))
        return future

    ArtemisBackend.send = send_then_die  # type: ignore[method-assign]
    ArtemisBackend.submit = submit_then_die  # type: ignore[method-assign]
    profile = EntityProfile(entity, id_cache_size=int(cache))
    with Relay(outbox, broker, [profile], ledger=ledger, lease=timedelta(seconds=1)) as relay:
        relay.drain()
    sys.exit("the relay published without crashing")


if __name__ == "__main__":
    main()
