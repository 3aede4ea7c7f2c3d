"""Turn a broker file of today's schema into one an older sendonce wrote.

The upgrade tests start from a file made by today's code and take it back, one
version at a time, to the layout that version had; then they open it and check
the upgrade. Each step undoes exactly what the upgrade to the next version adds.
"""

from __future__ import annotations

import sqlite3


def as_version_6(conn: sqlite3.Connection) -> None:
    """Version 6: names are case-sensitive; subscriptions have no settings of their own."""
    conn.execute("DROP INDEX entities_name_nocase")
    conn.execute("DROP INDEX subscriptions_name_nocase")
    conn.execute("ALTER TABLE subscriptions DROP COLUMN profile")
    conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")


def as_version_5(conn: sqlite3.Connection) -> None:
    """Version 5: ``ids_age`` orders the ids; count-bounded caches keep ordinals in ``stamp``."""
    as_version_6(conn)
    conn.execute("DROP INDEX ids_ordinal")
    conn.execute("UPDATE ids SET stamp = ordinal WHERE ordinal IS NOT NULL")
    conn.execute("ALTER TABLE ids DROP COLUMN ordinal")
    conn.execute("CREATE INDEX ids_age ON ids (eid, stamp)")
    conn.execute("ALTER TABLE entities DROP COLUMN sweep_mid")
    conn.execute("ALTER TABLE entities DROP COLUMN sweep_pkey")
    conn.execute("ALTER TABLE entities DROP COLUMN first_stamp")
    conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
