"""Every renamed or moved public name still works for a deprecation period, and warns once.

``NotSentError`` / ``NotStoredError`` became ``AttemptNotSentError`` / ``NeverSentError``;
the receive side's errors moved to ``sendonce.backends.local``. The old spellings (from
``sendonce`` and ``sendonce.errors``) are the same classes, so ``except`` clauses written
against them keep catching what the package raises.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import sendonce
import sendonce.backends.local
import sendonce.errors

RENAMED = {"NotSentError": "AttemptNotSentError", "NotStoredError": "NeverSentError"}
MOVED = [
    "LockLostError",
    "SessionLockLostError",
    "SessionCannotBeLockedError",
    "NoSessionAvailableError",
]


def _import_as_a_user(statement: str) -> tuple[object, list[warnings.WarningMessage]]:
    """Run ``statement`` (binding ``value``) as a user's module would, recording warnings."""
    scope: dict[str, object] = {"__name__": "users_code"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(statement, "users_code.py", "exec"), scope)
    return scope["value"], [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("module", ["sendonce", "sendonce.errors"])
@pytest.mark.parametrize(("old", "new"), RENAMED.items())
def test_a_renamed_error_is_the_new_class_and_warns_once(module: str, old: str, new: str) -> None:
    value, caught = _import_as_a_user(f"from {module} import {old} as value")
    assert value is getattr(sendonce.errors, new)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert str(caught[0].message) == (
        f"{module}.{old} is deprecated: use {module}.{new}, the same class; "
        "the old name goes in 0.2"
    )
    assert caught[0].filename == "users_code.py"  # points at the user's line, not ours


@pytest.mark.parametrize("module", ["sendonce", "sendonce.errors"])
@pytest.mark.parametrize("name", MOVED)
def test_a_moved_receive_error_is_the_local_brokers_class_and_warns(module: str, name: str) -> None:
    value, caught = _import_as_a_user(f"import {module} as m\nvalue = m.{name}")
    assert value is getattr(sendonce.backends.local, name)
    assert len(caught) == 1
    assert "import it from sendonce.backends.local" in str(caught[0].message)


def test_message_not_found_was_never_top_level_and_is_not_now() -> None:
    with pytest.raises(AttributeError, match="MessageNotFoundError"):
        sendonce.MessageNotFoundError  # noqa: B018
    with pytest.warns(DeprecationWarning):
        assert sendonce.errors.MessageNotFoundError is sendonce.backends.local.MessageNotFoundError


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchError"):
        sendonce.NoSuchError  # noqa: B018
    with pytest.raises(AttributeError, match="NoSuchError"):
        sendonce.errors.NoSuchError  # noqa: B018


def test_an_except_clause_with_an_old_name_catches_what_the_package_raises(
    tmp_path: Path,
) -> None:
    from sendonce import EntityProfile
    from sendonce.backends.local import LocalBackend

    with pytest.warns(DeprecationWarning):
        old_lock_lost = sendonce.LockLostError
    with LocalBackend(str(tmp_path / "broker.db")) as broker:
        broker.create_entity(EntityProfile("orders"))
        broker.send("orders", [sendonce.Message("x", message_id="a")], timeout=5.0)
        [received] = broker.receive("orders", mode="peek_lock")
        assert received.lock_token is not None
        broker.complete("orders", received.lock_token)
        with pytest.raises(old_lock_lost):  # settled twice: the lock is gone
            broker.complete("orders", received.lock_token)


def test_the_packages_own_modules_import_without_a_deprecation_warning() -> None:
    # A user running with warnings as errors must be able to import every module of the
    # package: none of them may use an old spelling in a way that warns.
    code = (
        "import importlib, pkgutil, sendonce\n"
        "for info in pkgutil.walk_packages(sendonce.__path__, 'sendonce.'):\n"
        "    if not info.name.endswith('__main__'):\n"
        "        importlib.import_module(info.name)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error:sendonce:DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_new_names_are_documented_where_the_old_ones_were() -> None:
    assert "AttemptNotSentError" in (sendonce.errors.__doc__ or "")
    assert "NeverSentError" in (sendonce.errors.__doc__ or "")
    for new in RENAMED.values():
        assert getattr(sendonce, new).__doc__
