"""The cross-client suite: scenarios written with the JavaScript SDK (`@azure/service-bus`)
run against a fresh emulator, so a second official client checks what the Python one cannot.

The scenarios live in tests/crossclient/scenarios (one file each); the node runner prints one
JSON line per scenario and each becomes its own test here, named after the scenario.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

from sendonce import EntityProfile
from sendonce.backends.local import LocalBackend
from sendonce.emulator import Emulator

pytestmark = pytest.mark.emulator

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "tests" / "crossclient"
SCENARIOS = sorted(path.stem for path in (SUITE / "scenarios").glob("*.js"))
# Each entity's lock unless it names its own: long, so that no lock expires while a busy
# machine is slow to settle (at load 12 a 5 s lock was lost before the client's renewal
# landed). The lock scenarios' entities ("short_lock" in entities.json) take SHORT_LOCK, so
# their expiries wait seconds; the scenarios are told it (CROSSCLIENT_LOCK_DURATION_MS).
LOCK_DURATION = timedelta(seconds=60)
SHORT_LOCK = timedelta(seconds=5)
RUN_TIMEOUT_S = 240
DIVERGENCE_TABLE = REPO / "docs" / "emulator.md"


def _fields(options: dict[str, Any]) -> dict[str, Any]:
    """Profile fields from entities.json's keys (durations in *_seconds keys)."""
    fields: dict[str, Any] = {}
    for key, value in options.items():
        if key.endswith("_seconds"):
            fields[key.removesuffix("_seconds")] = timedelta(seconds=value)
        else:
            fields[key] = value
    return fields


def create_entities(path: Path) -> None:
    """Creates the broker file's entities from entities.json: each gets the suite's long lock
    unless it names its own (or ``short_lock``); a subscription is a name or a name with its
    own settings."""
    spec = json.loads((SUITE / "entities.json").read_text(encoding="utf-8"))
    with LocalBackend(path) as store:
        for entry in spec["entities"]:
            options = dict(entry)
            name = options.pop("name")
            subscriptions = options.pop("subscriptions", [])
            lock = SHORT_LOCK if options.pop("short_lock", False) else LOCK_DURATION
            fields = {"lock_duration": lock, **_fields(options)}
            store.create_entity(EntityProfile(name, **fields))
            for subscription in subscriptions:
                if isinstance(subscription, str):
                    store.create_subscription(name, subscription)
                else:
                    settings = dict(subscription)
                    sub_name = settings.pop("name")
                    store.create_subscription(name, sub_name, **_fields(settings))


def node_problem() -> str | None:
    """Why the suite cannot run here (no Node.js 20+ or npm), or None."""
    install = (
        "install Node.js 20+ and npm (apt-get install nodejs npm, or brew install node), "
        "then tests/crossclient/install.sh"
    )
    pretend = "node" in os.environ.get("SENDONCE_PRETEND_MISSING", "").split(",")
    node = shutil.which("node")
    if pretend or node is None or shutil.which("npm") is None:
        return f"requires Node.js 20+ and npm for the cross-client suite: {install}"
    shown = subprocess.run(
        [node, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    major = int(match.group(1)) if (match := re.match(r"v(\d+)", shown)) else 0
    if major < 20:
        return f"requires Node.js 20+ for the cross-client suite (found {shown.strip()}): {install}"
    return None


@pytest.fixture(scope="module")
def node_modules() -> str:
    """The suite's node packages, installed with npm ci from the lockfile when missing.

    Without Node.js the suite is skipped, saying how to install it, except under
    SENDONCE_REQUIRE_COMPONENTS=1 (set by CI), where that fails: CI never passes by skipping.
    """
    problem = node_problem()
    if problem is not None:
        if os.environ.get("SENDONCE_REQUIRE_COMPONENTS") == "1":
            pytest.fail(f"SENDONCE_REQUIRE_COMPONENTS=1: {problem}")
        pytest.skip(f"{problem} [missing component]")
    done = subprocess.run(
        [str(SUITE / "install.sh")], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"npm ci failed:\n{done.stderr}"
    return done.stdout.strip()


def interop_messages() -> list[dict[str, Any]]:
    """The messages each client sends for the other to check (tests/crossclient/interop.json)."""
    spec = json.loads((SUITE / "interop.json").read_text(encoding="utf-8"))
    messages: list[dict[str, Any]] = spec["messages"]
    return messages


@pytest.fixture(scope="module")
def suite_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """One fresh emulator for the whole suite, with interop.json sent by the Python client."""
    path = tmp_path_factory.mktemp("crossclient") / "broker.db"
    create_entities(path)
    # No emulator-wide lock duration: each entity's own (entities.json) governs its locks.
    with Emulator(path, poll_interval=0.02) as emulator:
        with (
            ServiceBusClient.from_connection_string(emulator.connection_string) as client,
            client.get_queue_sender("from-python") as sender,
        ):
            sender.send_messages(
                [
                    ServiceBusMessage(
                        spec["body"].encode("utf-8"),
                        message_id=spec["messageId"],
                        content_type=spec.get("contentType"),
                        subject=spec.get("subject"),
                        correlation_id=spec.get("correlationId"),
                        application_properties=spec["applicationProperties"] or None,
                    )
                    for spec in interop_messages()
                ]
            )
        yield emulator


@pytest.fixture(scope="module")
def suite_results(node_modules: str, suite_emulator: Emulator) -> dict[str, Any]:
    """Runs every scenario once against the suite's emulator; results by scenario name."""
    env = {
        **os.environ,
        "NODE_PATH": node_modules,
        "SERVICEBUS_CONNECTION_STRING": suite_emulator.connection_string,
        "CROSSCLIENT_LOCK_DURATION_MS": str(int(SHORT_LOCK.total_seconds() * 1000)),
    }
    done = subprocess.run(
        ["node", str(SUITE / "run.js")],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    results: dict[str, Any] = {"__stderr__": done.stderr}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            results[result["scenario"]] = result
    return results


def _text(value: object) -> object:
    """The Python client hands application property keys and strings back as bytes."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def test_python_client_receives_what_the_javascript_client_sent(
    suite_results: dict[str, Any], suite_emulator: Emulator
) -> None:
    assert suite_results.get("python_interop", {}).get("status") == "passed"
    expected = interop_messages()
    with (
        ServiceBusClient.from_connection_string(suite_emulator.connection_string) as client,
        client.get_queue_receiver(
            "to-python", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver,
    ):
        received = []
        while len(received) < len(expected):
            batch = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            if not batch:
                break
            received.extend(batch)
    assert [str(m.message_id) for m in received] == [spec["messageId"] for spec in expected]
    for message, spec in zip(received, expected, strict=True):
        assert b"".join(message.body) == spec["body"].encode("utf-8"), spec["messageId"]
        assert message.content_type == spec.get("contentType"), spec["messageId"]
        assert message.subject == spec.get("subject"), spec["messageId"]
        assert message.correlation_id == spec.get("correlationId"), spec["messageId"]
        sent_properties = message.application_properties or {}
        properties = {_text(key): _text(value) for key, value in sent_properties.items()}
        assert properties == spec["applicationProperties"], spec["messageId"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: str, suite_results: dict[str, Any]) -> None:
    result = suite_results.get(scenario)
    assert result is not None, (
        f"{scenario} reported no result; runner stderr:\n{suite_results['__stderr__']}"
    )
    assert result["status"] == "passed", f"{scenario} failed:\n{result['error']}"


def test_divergence_table_lists_the_known_divergence_scenarios(
    suite_results: dict[str, Any],
) -> None:
    """Every scenario marked as a known divergence has its row in docs/emulator.md, and every
    row names a scenario that still reports one: the table and the checks change together."""
    marked = {
        name
        for name, result in suite_results.items()
        if isinstance(result, dict) and result.get("divergence")
    }
    text = DIVERGENCE_TABLE.read_text(encoding="utf-8")
    section = text.split("## Known divergences", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`crossclient/scenarios/(\w+)\.js`", section))
    assert listed == marked
