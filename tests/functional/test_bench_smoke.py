"""Every script in bench/ runs, with tiny sizes (``--smoke``), against today's package.

docs/benchmarks.md gives a command per figure; a script that stops with an error (as
``bench_ids.py`` did once its prototype fell behind the package) makes those figures
unreproducible. Each script runs here in a subprocess, as the docs run it, in a temporary
directory: a new script is refused until it is listed below. The runs with a long set-up
(the two Spark scripts start a Spark session each; ``bench_aio.py`` and the emulator's
``--links`` mode warm many sender links) run under ``-m slow``; the rest take about a
minute together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_SPARK = [pytest.mark.slow, pytest.mark.spark]

# script -> the runs of it: (extra arguments, "{tmp}" being the test's directory; marks)
RUNS: dict[str, list[tuple[list[str], list[pytest.MarkDecorator]]]] = {
    "bench_aio.py": [([], [pytest.mark.slow, pytest.mark.emulator])],  # 25 links to warm
    "bench_aio_cpu.py": [([], [])],
    "bench_aio_stall.py": [([], [])],
    "bench_artemis.py": [([], [pytest.mark.slow, pytest.mark.artemis])],  # starts a broker
    "bench_broker.py": [(["--dir", "{tmp}"], [])],  # its files stay where --dir says
    "bench_cli_publish.py": [([], [])],
    "bench_engine.py": [([], [])],
    "bench_emulator.py": [
        ([], [pytest.mark.emulator]),
        (["--links", "2"], [pytest.mark.slow, pytest.mark.emulator]),
    ],
    "bench_ids.py": [([], [])],
    "bench_ledger.py": [([], [pytest.mark.emulator, pytest.mark.postgres])],
    "bench_outbox.py": [([], [pytest.mark.emulator, pytest.mark.postgres])],
    "bench_sender.py": [([], [])],
    "bench_sender_memory.py": [([], [])],
    "bench_servicebus.py": [([], [])],
    "bench_servicebus_sharing.py": [([], [pytest.mark.emulator])],
    "bench_spark.py": [([], _SPARK)],
    "bench_spark_rows.py": [([], [])],
    "bench_spark_servicebus.py": [([], [*_SPARK, pytest.mark.emulator])],
    "bench_telemetry.py": [([], [])],
    "delay_proxy.py": [(["--check"], [])],
}


def test_every_script_in_bench_has_a_smoke_run() -> None:
    scripts = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
    assert scripts == sorted(RUNS), "list each new bench/ script in RUNS, with its marks"


@pytest.mark.parametrize(
    ("script", "extra"),
    [
        pytest.param(script, extra, marks=marks, id=" ".join([script, *extra[:1]]))
        for script, runs in RUNS.items()
        for extra, marks in runs
    ],
)
def test_the_script_runs_with_tiny_sizes(script: str, extra: list[str], tmp_path: Path) -> None:
    arguments = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), "--smoke", *arguments],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its emulator, proxy and workers stop with it on a timeout
    )
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{script} --smoke did not finish in 240 s:\n{out[-2000:]}\n{err[-2000:]}")
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{err[-4000:]}"
    assert out.strip(), f"{script} --smoke printed nothing"
    assert "Traceback" not in err, err[-4000:]
