"""Fresh PostgreSQL databases on the run's throwaway cluster (imported, not a test module)."""

from __future__ import annotations

import itertools

_numbers = itertools.count(1)


def fresh_database(server: str, prefix: str) -> str:
    """A new, empty database on ``server``: its url."""
    import psycopg

    name = f"{prefix}_{next(_numbers)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + f"/{name}"
