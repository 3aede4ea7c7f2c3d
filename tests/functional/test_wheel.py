"""The wheel users install: built offline from a copy of the project, its metadata, and a run.

The wheel is built by pip with the installed setuptools (no build isolation, no index: no
network), from a copy of the whole project, tests and benchmarks included, so that leaving
them out of the wheel is checked. It is then installed into a fresh virtual environment, and
``sendonce demo`` runs from that environment's console script, outside the source tree and
without PYTHONPATH. Every process of the run records which ``sendonce`` it imported, which
proves that the installed copy ran, not the source.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.message import Message
from pathlib import Path

import click
import pytest
import tenacity
import xxhash

import sendonce

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
HOME = PYPROJECT["project"]["urls"]["Homepage"]
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
)
# A .pth line runs at interpreter start-up: record the sendonce each process imported.
WITNESS = (
    "import atexit, os, sys; "
    "atexit.register(lambda: open(os.environ['SENDONCE_WITNESS'], 'a').write("
    "f\"{os.getpid()} {getattr(sys.modules.get('sendonce'), '__file__', None)}\\n\")) "
    "if 'SENDONCE_WITNESS' in os.environ else None\n"
)


def without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    project = work / "project"
    shutil.copytree(ROOT, project, ignore=NOT_COPIED)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(work / "dist"), str(project)],
        check=True, capture_output=True, text=True, timeout=120, env=without_pythonpath(),
    )  # fmt: skip
    (built,) = (work / "dist").glob("sendonce-*.whl")
    return built


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode("utf-8"))


def test_the_metadata_names_the_project_its_version_python_and_extras(
    wheel: Path, metadata: Message
) -> None:
    assert metadata["Name"] == "sendonce"
    assert metadata["Version"] == sendonce.__version__
    assert wheel.name == f"sendonce-{sendonce.__version__}-py3-none-any.whl"
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["License-Expression"] == "MIT"
    assert set(metadata.get_all("Provides-Extra") or ()) == {
        "azure", "aio", "emulator", "spark", "postgres", "artemis", "otel", "outbox", "docs", "dev"
    }  # fmt: skip
    requires = metadata.get_all("Requires-Dist") or []
    assert 'pyspark[connect]<5,>=4.0; extra == "spark"' in requires
    assert 'opentelemetry-api>=1.27; extra == "otel"' in requires
    assert metadata["Author"] == metadata["Maintainer"] == "The sendonce team"


def test_the_classifiers_say_typed_python_3_11_and_what_it_is_for(metadata: Message) -> None:
    classifiers = set(metadata.get_all("Classifier") or ())
    for expected in (
        "Typing :: Typed",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3 :: Only",
        "Topic :: System :: Distributed Computing",
        "Intended Audience :: Developers",
    ):
        assert expected in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)


def test_every_project_address_is_the_repository_s(metadata: Message) -> None:
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or ())
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}
    assert urls["Homepage"] == "https://github.com/sendonce/sendonce"
    for url in urls.values():
        assert url == HOME or url.startswith(HOME + "/")
    for url in (urls["Documentation"], urls["Changelog"]):
        assert (ROOT / url.removeprefix(HOME + "/blob/main/")).is_file(), url


def test_the_long_description_links_work_on_a_package_index_page(metadata: Message) -> None:
    description = metadata.get_payload()
    assert isinstance(description, str) and "# sendonce" in description
    links = re.findall(r"\]\(([^)\s]+)\)", description)
    assert links, "the README links the documentation"
    for link in links:
        assert link.startswith("https://"), f"relative link {link!r} breaks on an index page"
        if link.startswith(HOME + "/blob/main/"):
            assert (ROOT / link.removeprefix(HOME + "/blob/main/")).is_file(), link


def test_the_wheel_holds_the_package_typed_and_nothing_else(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "sendonce = sendonce.cli:main" in archive.read(entry_points).decode()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"sendonce", f"sendonce-{sendonce.__version__}.dist-info"}
    assert "sendonce/py.typed" in names
    assert f"sendonce-{sendonce.__version__}.dist-info/licenses/LICENSE" in names
    sources = {n for n in names if n.startswith("sendonce/") and n.endswith(".py")}
    on_disk = {
        p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "sendonce").rglob("*.py")
    }
    assert sources == on_disk


def test_sendonce_demo_runs_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True, capture_output=True, text=True, timeout=120, env=without_pythonpath(),
    )  # fmt: skip
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, env=without_pythonpath(),
        ).stdout.strip()
    )  # fmt: skip
    # The core dependencies come from this test's environment (no network): their
    # directories go after the new environment's own, which holds the wheel's sendonce.
    found = {str(Path(m.__file__).resolve().parent.parent) for m in (click, tenacity, xxhash)}
    (site / "dependencies.pth").write_text("\n".join(sorted(found)) + "\n")
    (site / "witness.pth").write_text(WITNESS)

    script = venv / "bin" / "sendonce"
    assert script.read_text().splitlines()[0] == f"#!{python}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    witness = tmp_path / "witness.txt"
    proc = subprocess.run(
        [str(script), "demo", "--orders", "200", "--workdir", str(run_dir)],
        cwd=run_dir, capture_output=True, text=True, timeout=300,
        env={**without_pythonpath(), "SENDONCE_WITNESS": str(witness)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "killed with SIGKILL" in proc.stdout
    assert "messages in the queue: 200 for 200 orders" in proc.stdout
    assert "EXACTLY ONCE" in proc.stdout

    imported = [line.split(" ", 1)[1] for line in witness.read_text().splitlines()]
    # The command and the restarted producer (the first producer is SIGKILLed: no record).
    assert len(imported) >= 2, "the demo's processes record which sendonce they imported"
    installed = str(site / "sendonce" / "__init__.py")
    assert set(imported) == {installed}, imported
