"""The tests that interrupt with SIGINT pass when pytest itself was started ignoring it.

That is how ``pytest &`` and ``nohup pytest`` start it, and how some CI agents start their
jobs: Python then leaves SIGINT ignored, and so would every child. Those tests restore
SIGINT's default where they send it (``tests/_interrupts.py``); this runs two of them, one
interrupting its own process and one a child, in a pytest that starts with SIGINT ignored
and requires both to pass.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# One test that SIGINTs this process, one that SIGINTs a child; the others use the same helper.
INTERRUPTING = [
    "tests/functional/ledger/test_ledger_transfers.py::"
    "test_ctrl_c_while_a_window_is_written_ahead_releases_it_and_confirms_the_acked[1]",
    "tests/integration/emulator/test_emulator_lifecycle.py::test_cli_serves_until_interrupted",
]
# The child checks that it did inherit the ignored signal before it runs them.
_RUN = """
import signal, sys
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGINT)
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "", *sys.argv[1:]]))
"""


@pytest.mark.emulator
def test_the_sigint_tests_pass_in_a_pytest_started_with_sigint_ignored() -> None:
    # Ignored here while the child starts: an ignored signal stays ignored across exec.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUN, *INTERRUPTING],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    assert "2 passed" in out, out[-4000:]
