"""Issue 14 (11): public methods say what they do; the local broker's own API type-checks."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

PUBLIC = [
    "sendonce",
    "sendonce.backends",
    "sendonce.backends.local",
    "sendonce.testing",
    "sendonce.aio",
    "sendonce.emulator",
    "sendonce.errors",
]


def _undocumented() -> list[str]:
    missing, seen = [], set()
    for module_name in PUBLIC:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not inspect.isclass(obj) or obj in seen:
                continue
            seen.add(obj)
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                target = value.fget if isinstance(value, property) else value
                target = getattr(target, "__func__", target)
                if callable(target) and not (target.__doc__ or "").strip():
                    missing.append(f"{obj.__qualname__}.{attr}")
    return missing


def test_every_public_method_has_a_docstring() -> None:
    assert _undocumented() == []


def test_connect_local_returns_a_typed_local_backend(tmp_path: Path) -> None:
    from sendonce.backends import connect_local
    from sendonce.backends.local import LocalBackend

    with connect_local(f"local://{tmp_path}/b.db") as broker:
        assert isinstance(broker, LocalBackend) and broker.entities() == []
    with connect_local(tmp_path / "b.db") as broker:
        assert broker.path == str(tmp_path / "b.db")


def test_receive_on_connect_local_passes_mypy_strict(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    program = tmp_path / "consumer.py"
    program.write_text(
        "from sendonce.backends import connect_local\n\n"
        'with connect_local("local:///tmp/x.db") as broker:\n'
        '    names: list[str] = [m.message_id for m in broker.receive("orders")]\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(program)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
