"""The asyncio sender over the real Artemis broker with a ledger, its task cancelled in the
middle of ``send_many``: the keys left in doubt are bounded by what was in flight (at most
``max_in_flight`` transfers of ``max_batch_messages``), never the rest of the input, on both
ledger stores. The operator settles them (browse the queue, confirm or release), and the
re-run stores every message once.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from combo_databases import fresh_database

from artemis.raw import browse_ids, drain, message_count
from sendonce import EntityProfile, Message, aio
from sendonce.cli import main

pytestmark = [pytest.mark.artemis, pytest.mark.timeout(240)]

BATCH, IN_FLIGHT, TOTAL = 10, 16, 4000


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'ledger.db'}"
    return fresh_database(request.getfixturevalue("postgres_server"), "combo_ledger")


def cli(*args: str) -> dict[str, object]:
    done = CliRunner().invoke(main, [*args, "--json"])
    assert done.exit_code == 0 and "Traceback" not in done.output, done.output
    found: dict[str, object] = json.loads(done.stdout)
    return found


def orders() -> list[Message]:
    return [
        Message(f"body {i}", message_id=f"order-{i}", partition_key=f"k{i % 16}")
        for i in range(TOTAL)
    ]


async def send_until_cancelled(url: str, profile: EntityProfile, ledger: str) -> int:
    """``send_many`` of every order, cancelled once the broker holds a tenth of them."""
    async with aio.IdempotentSender(
        url, profile, ledger=ledger, max_batch_messages=BATCH, max_in_flight=IN_FLIGHT
    ) as sender:
        task = asyncio.ensure_future(sender.send_many(orders()))
        while await asyncio.to_thread(message_count, url, profile.name) < TOTAL // 10:
            assert not task.done(), "sent everything before it could be cancelled"
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sender.max_in_flight


async def send_all(url: str, profile: EntityProfile, ledger: str) -> tuple[int, int]:
    async with aio.IdempotentSender(url, profile, ledger=ledger, max_batch_messages=BATCH) as s:
        report = await s.send_many(orders())
    assert report.failed == 0, report.failures[:3]
    return report.sent, len(report.from_ledger)


def test_a_cancelled_send_many_leaves_in_doubt_only_what_was_in_flight(
    artemis_broker, artemis_address: str, ledger_url: str
) -> None:
    url = artemis_broker.url()
    profile = EntityProfile(artemis_address, id_cache_size=20_000)
    assert cli("ledger", "create", ledger_url)["status"] == "ok"
    assert asyncio.run(send_until_cancelled(url, profile, ledger_url)) == IN_FLIGHT

    doubt = cli("ledger", "in-doubt", ledger_url, "--entity", artemis_address, "--all")
    in_doubt = {k["message_id"] for k in doubt["keys"]}  # type: ignore[union-attr]
    assert len(in_doubt) <= IN_FLIGHT * BATCH, f"{len(in_doubt)} keys in doubt"
    stored = browse_ids(url, artemis_address)
    assert len(stored) == len(set(stored)) < TOTAL
    held = in_doubt & set(stored)
    for resolution, keys in (("confirm", held), ("release", in_doubt - held)):
        if keys:
            listed = json.dumps(sorted(keys))  # with --json, --from reads JSON
            done = CliRunner().invoke(
                main,
                [
                    "ledger",
                    resolution,
                    ledger_url,
                    "--entity",
                    artemis_address,
                    "--from",
                    "-",
                    "--force",
                    "--json",
                ],
                input=listed,
            )
            assert done.exit_code == 0, done.output
            assert json.loads(done.stdout)["count"] == len(keys)

    sent, skipped = asyncio.run(send_all(url, profile, ledger_url))
    assert (sent, skipped) == (TOTAL - len(stored), len(stored))
    ids = [str(m.id) for m in drain(url, artemis_address)]
    assert sorted(ids) == sorted(m.message_id for m in orders()) and len(ids) == TOTAL
