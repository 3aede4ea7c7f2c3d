"""The executor-side local:// check: same machine, same file as the driver saw."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import pytest

from sendonce import ConfigurationError
from sendonce.spark._placement import Placement, this_machine


def _broker(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "broker.db"
    path.write_bytes(b"")
    return f"local://{path}", path


def test_the_driver_s_own_file_on_its_own_machine_passes(tmp_path: Path) -> None:
    url, _ = _broker(tmp_path)
    placement = Placement.of(url)
    assert placement is not None and placement.machine == this_machine()
    pickle.loads(pickle.dumps(placement)).check()  # as a task receives it


def test_a_service_bus_url_needs_no_placement() -> None:
    url = "Endpoint=sb://127.0.0.1:5672/;SharedAccessKeyName=k;SharedAccessKey=s"
    assert Placement.of(url) is None


def test_another_machine_is_refused_naming_the_url(tmp_path: Path) -> None:
    url, _ = _broker(tmp_path)
    placement = Placement.of(url)
    assert placement is not None
    elsewhere = dataclasses.replace(placement, machine="worker-7/0000")
    with pytest.raises(ConfigurationError, match="not on the driver's machine") as caught:
        elsewhere.check()
    assert caught.value.field == "url"
    assert "'worker-7'" in str(caught.value)


@pytest.mark.parametrize("change", ["replaced", "removed"])
def test_a_file_that_is_not_the_driver_s_is_refused(tmp_path: Path, change: str) -> None:
    url, path = _broker(tmp_path)
    placement = Placement.of(url)
    assert placement is not None
    if change == "replaced":  # created while the old one exists: a new inode
        (tmp_path / "other.db").write_bytes(b"")
        (tmp_path / "other.db").rename(path)
    else:
        os.unlink(path)
    expected = "is another file" if change == "replaced" else "does not exist"
    with pytest.raises(ConfigurationError, match=expected):
        placement.check()
