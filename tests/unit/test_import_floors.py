"""No module of sendonce imports from a higher floor, so no import circle can span the rooms.

A room is a direct child of the package (a module such as ``_sender`` or a subpackage such
as ``backends``); ``sendonce/__init__.py``, the facade that re-exports the public names, is
the room ``sendonce``. The floors below were read off the code: each room imports only from
rooms on lower floors (never from a room on its own floor), counting every import -- at
module level, inside functions, and under ``TYPE_CHECKING``, because a typing-only arrow
still ties the two modules together for readers and type checkers. A new room must be
given a floor here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sendonce

PACKAGE = Path(sendonce.__file__).resolve().parent

FLOORS: list[tuple[str, ...]] = [
    # The ground: values and errors, no I/O.
    ("errors", "_extras", "_names"),  # the exception tree; install hints; names ignoring case
    ("_ids",),  # message ids
    ("_message",),  # Message, MessageSpec
    ("_property_quotas",),  # the size quotas of message properties
    ("_entity", "_message_columns"),  # entity rules; messages as columns
    ("_subscription",),  # a subscription's own receive settings
    ("telemetry",),  # the telemetry core (switch, providers, spans, propagation) and its set-up
    ("_propagation",),  # the trace context a traced transfer's messages carry
    ("_sender_telemetry",),  # the sender's spans and metrics on that core
    ("_telemetry",),  # the old path: re-exports for the backends, the outbox relay's gauges
    # Mechanisms.
    # retry policy; one SQLite connection per file; transfers in flight (one per key at a time);
    # the bounded buffer a streamed send_many reads its input into
    ("_retry", "_sqlite_share", "_inflight", "_buffer"),
    ("backends",),  # where messages go
    ("_report",),  # what a send call reports, per message
    ("_flight",),  # one transfer's way through a backend's native submit, and its retries
    ("_effects",),  # what a sender call asks its shell to do, and the two ways to run a call
    # what was sent, durably, and the run protocol a call follows around its transfers
    # (reconcile reads the local broker; a run reports what the ledger decided)
    ("ledger",),
    ("_ledger_layer",),  # where the sender core finds the ledger's run protocol (names only)
    ("_sender_core",),  # what every sender does: validation, batching, memory, accounting
    ("_calls",),  # every sender call written once as sans-I/O steps (both shells run them)
    # The senders and what serves or wraps a backend.
    ("_sender", "emulator", "testing"),
    ("aio", "spark", "outbox"),  # the asyncio mirror; Spark publishing; the outbox relay
    # The facade and the command line.
    ("sendonce",),  # sendonce/__init__.py: the public names
    ("cli",),
]


# Deliberate arrows upward, each imported on access only and gone with what it serves:
# sendonce.errors redirects the deprecated receive-side names to sendonce.backends.local
# (until 0.2).
ALLOWED_UPWARD = {("sendonce.errors", "sendonce.backends.local")}


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_names(root: Path) -> dict[str, Path]:
    names = {}
    for path in root.rglob("*.py"):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports(root: Path) -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every import inside the package."""
    modules = module_names(root)
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                # ``from . import x`` imports the module ``x`` when there is one.
                targets = [
                    f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                if target == root.name or target.startswith(root.name + "."):
                    found.append((module, target, node.lineno))
    return found


def floor_of() -> dict[str, int]:
    return {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def upward(root: Path) -> list[str]:
    floors = floor_of()
    wrong = []
    for module, target, line in imports(root):
        here, there = room_of(module), room_of(target)
        if (module, target) in ALLOWED_UPWARD:
            continue
        if here != there and floors[there] >= floors[here]:
            wrong.append(f"{module}:{line} imports {target} ({there} is not below {here})")
    return wrong


def test_every_room_has_a_floor() -> None:
    rooms = {room_of(module) for module in module_names(PACKAGE)}
    assert sorted(rooms - set(floor_of())) == [], "give the new room a floor in FLOORS"


def test_no_module_imports_from_its_own_floor_or_above() -> None:
    assert upward(PACKAGE) == []


def test_a_typing_only_import_from_a_higher_floor_is_found(tmp_path: Path) -> None:
    root = tmp_path / "sendonce"
    (root / "spark").mkdir(parents=True)
    (root / "__init__.py").write_text("from .errors import SendOnceError\n")
    (root / "spark" / "__init__.py").write_text("from ..errors import SendOnceError\n")
    (root / "errors.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .spark import PublishReport\n"
        "def later():\n"
        "    from sendonce import spark\n"
    )
    assert upward(root) == [
        "sendonce.errors:3 imports sendonce.spark (spark is not below errors)",
        "sendonce.errors:5 imports sendonce.spark (spark is not below errors)",
    ]
