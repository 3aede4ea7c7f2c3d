"""Issue 20 item 1, CLI side: every error class a backend can raise, on a batch and on a
single record, ends with the CLI's summary and exit status 1, never a traceback.

The classes come from the package itself (``tests/functional/test_error_paths.py``), so a
class added later is covered here too. The broker is a real local broker file whose
transfers all fail with the class under test: no real peer raises each class on demand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_error_paths import BACKEND_ERRORS, RaisingBackend, _instance

from sendonce.backends.local import LocalBackend
from sendonce.cli import _publish, main
from sendonce.errors import AttemptNotSentError


@pytest.mark.parametrize("records", [1, 3])
@pytest.mark.parametrize("error_class", BACKEND_ERRORS, ids=lambda c: c.__name__)
def test_every_backend_error_ends_with_the_summary(tmp_path, monkeypatch, error_class, records):
    db = tmp_path / "broker.db"
    assert (
        CliRunner().invoke(main, ["broker", "create", str(db), "--entity", "orders"]).exit_code == 0
    )
    source = tmp_path / "o.jsonl"
    source.write_text("".join(json.dumps({"order_id": i}) + "\n" for i in range(records)))
    error = _instance(error_class)
    monkeypatch.setattr(_publish, "connect", lambda url: RaisingBackend(LocalBackend(db), error))
    result = CliRunner().invoke(
        main,
        ["publish", str(source), "--to", f"local://{db}", "--entity", "orders", "--id",
         "{order_id}", "--attempts", "1", "--no-progress", "--json"],
    )  # fmt: skip
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    if issubclass(error_class, AttemptNotSentError):
        # The broker reached by no attempt: said once, and publish stops (issue 34 item 8).
        assert (report["status"], report["sent"], report["failed"]) == ("stopped", 0, 0)
        assert report["error"].startswith("the broker could not be reached")
    else:
        assert (report["status"], report["sent"], report["failed"]) == ("failed", 0, records)
        assert [f["line"] for f in report["failures"]] == list(range(1, records + 1))
    assert "Traceback" not in result.stderr
    with LocalBackend(db) as backend:
        assert backend.message_ids("orders") == []
