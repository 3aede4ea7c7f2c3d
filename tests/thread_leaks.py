"""A diagnostic plugin: which test left threads alive after its module ended.

A thread a test starts and never stops outlives it in the xdist worker, where a later test of
another module that counts threads (or waits for the process to go quiet) can see it.
``pytest -p thread_leaks tests/functional/aio`` lists, at the end of the run, each thread that
was still alive when the module that started it had finished (its module- and test-scoped
fixtures torn down, after a grace of a few seconds for threads already told to stop), and the
test after which it first appeared. Session-scoped fixtures' threads (a worker's Artemis
broker, PostgreSQL cluster, Spark session) outlive a module by design and are listed too.
Run it in one process (``-n 0``): under xdist the summary is the controller's. Not loaded by
default.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

_GRACE = 3.0  # seconds a thread told to stop (a pool shut down without waiting) may take
_seen: set[threading.Thread] = set()
_born_after: dict[threading.Thread, str] = {}
_module_threads: set[threading.Thread] = set()
_leaks: list[tuple[str, str, str]] = []


def _new_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t not in _seen}


def pytest_sessionstart(session: pytest.Session) -> None:
    _seen.update(threading.enumerate())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    yield
    for thread in _new_threads():
        _seen.add(thread)
        _born_after[thread] = item.nodeid
        _module_threads.add(thread)
    if nextitem is not None and nextitem.path == item.path:
        return
    # The module's fixtures are torn down: what it started should end now.
    deadline = time.monotonic() + _GRACE
    for thread in list(_module_threads):
        thread.join(max(0.0, deadline - time.monotonic()))
    for thread in sorted(_module_threads, key=lambda t: t.name):
        if thread.is_alive():
            _leaks.append((str(item.path), _born_after[thread], thread.name))
    _module_threads.clear()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _leaks:
        terminalreporter.write_line("thread_leaks: no thread outlived its module")
        return
    terminalreporter.section("threads alive after their module ended")
    for module, test, name in _leaks:
        terminalreporter.write_line(f"{module}: {name}  (first seen after {test})")
