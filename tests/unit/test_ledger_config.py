"""Bad ledger configurations are refused naming the field, before anything is sent."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from sendonce import ConfigurationError, EntityProfile, IdempotentSender, Ledger, LedgerError
from sendonce.backends import LocalBackend


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"in_doubt": "maybe"}, "in_doubt"),
        ({"retention": timedelta(0)}, "retention"),
        ({"retention": 30}, "retention"),
        ({"prune_limit": 0}, "prune_limit"),
        ({"clock": 5}, "clock"),
    ],
)
def test_bad_ledger_options(tmp_path: Path, kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Ledger(f"sqlite://{tmp_path / 'l.db'}", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize("url", ["", "mysql://x/y", "sqlite://host/x.db", "sqlite:///"])
def test_bad_ledger_urls(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Ledger(url)
    assert info.value.field == "ledger"


def test_retention_must_outlive_the_window(tmp_path: Path) -> None:
    with (
        Ledger(f"sqlite://{tmp_path / 'l.db'}", retention=timedelta(minutes=5)) as ledger,
        LocalBackend(tmp_path / "b.db") as broker,
        pytest.raises(ConfigurationError) as info,
    ):
        IdempotentSender(broker, EntityProfile("orders"), ledger=ledger)
    assert info.value.field == "retention"
    with LocalBackend(tmp_path / "b.db") as broker, pytest.raises(ConfigurationError):
        IdempotentSender(
            broker, EntityProfile("orders"), ledger=f"sqlite://{tmp_path / 'x.db'}?durability=no"
        )
    from sendonce import _sqlite_share

    # nothing of this test is left open by the refusals (other tests' files aside)
    assert [f for f in _sqlite_share.open_files() if f.startswith(str(tmp_path))] == []


def test_a_file_that_is_not_a_ledger_is_refused(tmp_path: Path) -> None:
    with LocalBackend(tmp_path / "b.db"):
        pass
    with pytest.raises(LedgerError) as info:
        Ledger(f"sqlite://{tmp_path / 'b.db'}")
    assert "not a sendonce ledger" in str(info.value)


def test_a_ledger_url_password_is_never_shown() -> None:
    with pytest.raises(LedgerError) as info:
        Ledger("postgresql://me:hunter2@127.0.0.1:1/db")
    assert "hunter2" not in str(info.value)
