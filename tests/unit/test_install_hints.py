"""Issue 14 (4): a missing optional extra is named, with the pip command that installs it.

Each case runs in a fresh interpreter where the extra's module cannot be imported
(``sys.modules[name] = None`` makes Python refuse it, as if it were not installed).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from sendonce._ids import MessageIdTemplate


def _run(blocked: str, code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys; sys.modules[{blocked!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60
    )


def test_import_sendonce_emulator_names_the_extra() -> None:
    proc = _run("proton", "import sendonce.emulator")
    assert proc.returncode != 0
    assert "pip install 'sendonce[emulator]'" in proc.stderr


def test_a_service_bus_url_names_the_azure_extra() -> None:
    code = (
        "from sendonce.backends import connect\n"
        "try:\n"
        "    connect('Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v')\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    proc = _run("azure", code)
    assert "pip install 'sendonce[azure]'" in proc.stdout, proc.stderr


def test_the_emulator_command_is_listed_and_names_its_extra() -> None:
    code = "from sendonce.cli import main; main()"
    listing = _run("proton", code.replace("main()", "main(['--help'])"))
    assert "emulator" in listing.stdout and "sendonce[emulator]" in listing.stdout
    proc = _run("proton", code.replace("main()", "main(['emulator', '--db', 'x.db'])"))
    assert proc.returncode == 2
    assert "pip install 'sendonce[emulator]'" in proc.stderr


@pytest.mark.parametrize("values", [["a", ""], ["", "b"]])
def test_spark_column_ids_refuse_empty_values_as_the_template_does(values: list[str]) -> None:
    from sendonce.spark._rows import _ColumnTemplate

    template = MessageIdTemplate("{a}.{b}/x")
    columns = {"a": values, "b": ["1", "2"]}
    failed: dict[int, object] = {}
    ids = _ColumnTemplate(template, {"a": "str", "b": "str"}).build(columns, 2, failed)  # type: ignore[arg-type]
    bad = values.index("")
    assert list(failed) == [bad] and ids[bad] == ""
    assert "is empty" in str(failed[bad])


def test_the_spark_demo_names_the_spark_extra() -> None:
    code = "from sendonce.cli import main; main(['demo', '--spark'])"
    proc = _run("pyspark", code)
    assert proc.returncode == 2
    assert "pip install 'sendonce[spark]'" in proc.stdout + proc.stderr
