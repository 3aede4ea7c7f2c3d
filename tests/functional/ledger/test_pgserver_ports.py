"""The throwaway PostgreSQL cluster (pgserver.py) starts on another port when the one it chose
is taken before the server binds it (an xdist worker's server may take it meanwhile)."""

from __future__ import annotations

import socket

import pgserver
import psycopg
import pytest

pytestmark = pytest.mark.postgres


def test_a_port_taken_before_the_server_binds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    picked: list[int] = []
    real = pgserver._free_port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]

        def first_pick_collides() -> int:
            picked.append(real() if picked else taken)
            return picked[-1]

        monkeypatch.setattr(pgserver, "_free_port", first_pick_collides)
        with pgserver.throwaway_cluster() as url:
            assert picked[0] == taken and len(picked) == 2
            assert url == f"postgresql://postgres@127.0.0.1:{picked[1]}/postgres"
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
