"""The reference site builds with ``mkdocs build --strict`` and shows every public name.

The real build (mkdocs.yml: Material, mkdocstrings over ``src/``) runs into a temporary
directory; each name of the public modules' ``__all__`` must have its own anchor in its
module's reference page. The two ways the strict build must fail are checked too: a public
name without a docstring (the hook in docs/reference/_hooks.py) and a broken link.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parents[2]

# Each public module and its reference page (docs/reference/<page>.md).
PAGES = {
    "sendonce": "sendonce",
    "sendonce.errors": "errors",
    "sendonce.backends": "backends",
    "sendonce.backends.local": "local",
    "sendonce.ledger": "ledger",
    "sendonce.outbox": "outbox",
    "sendonce.aio": "aio",
    "sendonce.spark": "spark",
    "sendonce.testing": "testing",
    "sendonce.emulator": "emulator",
    "sendonce.telemetry": "telemetry",
}


def _mkdocs(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_hooks", ROOT / "docs/reference/_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = _mkdocs("build", "--strict", "--site-dir", str(out))
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


@pytest.mark.parametrize("module", list(PAGES))
def test_every_public_name_has_its_entry_in_the_reference(site: Path, module: str) -> None:
    html = (site / "reference" / PAGES[module] / "index.html").read_text(encoding="utf-8")
    anchors = set(re.findall(r'id="([^"]+)"', html))
    names = importlib.import_module(module).__all__
    assert names, module
    assert [n for n in names if f"{module}.{n}" not in anchors] == []


def test_cross_references_show_as_code_not_as_rest_roles(site: Path) -> None:
    for page in sorted((site / "reference").glob("*/index.html")):
        html = page.read_text(encoding="utf-8")
        assert re.findall(r":(?:class|meth|func|attr|exc):<code>", html) == [], page.parent.name
    errors = (site / "reference" / "errors" / "index.html").read_text(encoding="utf-8")
    assert "<code>InDoubtError</code>" in errors  # :class:`InDoubtError` in NeverSentError's


def test_the_renamed_and_moved_errors_are_documented_where_they_live(site: Path) -> None:
    errors = (site / "reference" / "errors" / "index.html").read_text(encoding="utf-8")
    assert 'id="sendonce.errors.NeverSentError"' in errors
    assert 'id="sendonce.errors.LockLostError"' not in errors  # it moved
    local = (site / "reference" / "local" / "index.html").read_text(encoding="utf-8")
    assert 'id="sendonce.backends.local.SessionLockLostError"' in local


def test_the_guides_are_in_the_site_beside_the_reference(site: Path) -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), page.name


def test_a_public_name_without_a_docstring_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "sendonce"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A package."""\n'
        '__all__ = ["documented", "bare", "LIMIT", "Told"]\n'
        'def documented():\n    """Says why."""\n'
        "def bare():\n    pass\n"
        "LIMIT = 3\n"
        'Told = 4\n"""An attribute docstring counts."""\n'
    )
    assert _hooks().undocumented(tmp_path, ["sendonce"]) == ["sendonce.bare", "sendonce.LIMIT"]
    assert _hooks().undocumented(ROOT / "src") == []


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    # The project's own settings (strictness, link validation), over a small docs directory
    # without the API pages so the build is quick.
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guide.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        f"docs_dir: {docs}\n"
        "plugins: [search]\n"
        "hooks: []\n"
        "nav: [index.md]\n"
    )
    done = _mkdocs("build", "--strict", "-f", str(config), "--site-dir", str(tmp_path / "s"))
    assert done.returncode != 0
    assert "guide.md" in done.stderr
    (docs / "guide.md").write_text("# Guide\n")
    config.write_text(config.read_text().replace("nav: [index.md]", "nav: [index.md, guide.md]"))
    fixed = _mkdocs("build", "--strict", "-f", str(config), "--site-dir", str(tmp_path / "s"))
    assert fixed.returncode == 0, fixed.stderr
