"""The Responses store's copy on disk: one small SQLite file, so a restart of the store's
actor (Ray restarts it on the head node) reloads every response it held.

Written through: after each call that changed the table, the changed rows are written (and
the dropped ones deleted) in one transaction, before the call answers. WAL with
``synchronous=NORMAL``: a crash of the actor's process loses nothing committed; a power
loss of the head may lose the last transactions, and takes the whole cluster with it anyway.
The least-recently-used order is kept as of each response's last write (a read does not
write), which is all eviction needs after a restart.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict
from pathlib import Path

from roundgate.deployment.openai.response_store import ResponseStore, StoredResponse

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    entry TEXT NOT NULL,
    lease REAL
)
"""


class ResponseSnapshot:
    """The SQLite file at ``path`` mirroring one ``ResponseStore`` (made with ``journal``)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(SCHEMA)
        row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM responses").fetchone()
        self._seq = int(row[0])

    def load_into(self, store: ResponseStore) -> int:
        """Put every saved response back into ``store``, oldest write first; how many."""
        rows = self._db.execute("SELECT id, entry, lease FROM responses ORDER BY seq").fetchall()
        for response_id, entry, lease in rows:
            fields = json.loads(entry)
            fields["messages"] = tuple(fields["messages"])
            store.restore(response_id, StoredResponse(**fields), lease)
        store.take_changes()  # what was just loaded is on disk already
        return len(rows)

    def save(self, store: ResponseStore) -> None:
        """Write what changed in ``store`` since the last save, in one transaction."""
        written, dropped = store.take_changes()
        if not written and not dropped:
            return
        rows = []
        for response_id, (stored, lease) in written.items():
            self._seq += 1
            entry = json.dumps(asdict(stored), separators=(",", ":"), default=str)
            rows.append((response_id, self._seq, entry, lease))
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", rows)
            self._db.executemany("DELETE FROM responses WHERE id = ?", [(i,) for i in dropped])

    def close(self) -> None:
        self._db.close()
