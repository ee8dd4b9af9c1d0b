"""The embedded default: one SQLite file under the state directory. Survives restarts; several
worker processes of one gateway share it (WAL mode). Calls run in a worker thread so the event
loop never waits on the disk."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path

from gateway.store import StoredResponse

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created_at ON responses (created_at);
"""


class SqliteResponseStore:
    def __init__(self, path: Path, max_age_s: float | None, max_count: int | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._max_age_s = max_age_s
        self._max_count = max_count
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30.0, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed response survives the process; only a power cut may
        # lose the last ones.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def _put(self, record: StoredResponse) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, response, input_items) "
                "VALUES (?, ?, ?, ?)",
                (record.id, record.created_at, json.dumps(record.response), json.dumps(record.input_items)),
            )
            if self._max_age_s is not None:
                self._db.execute(
                    "DELETE FROM responses WHERE created_at < ?", (time.time() - self._max_age_s,)
                )
            if self._max_count is not None:
                self._db.execute(
                    "DELETE FROM responses WHERE id IN "
                    "(SELECT id FROM responses ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?)",
                    (self._max_count,),
                )

    def _get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT created_at, response, input_items FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
        if row is None:
            return None
        created_at, response, items = row
        if self._max_age_s is not None and created_at < time.time() - self._max_age_s:
            return None
        return StoredResponse(response_id, created_at, json.loads(response), json.loads(items))

    def _delete(self, response_id: str) -> bool:
        with self._lock:
            cursor = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cursor.rowcount > 0

    async def put(self, record: StoredResponse) -> None:
        await asyncio.to_thread(self._put, record)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await asyncio.to_thread(self._get, response_id)

    async def delete(self, response_id: str) -> bool:
        return await asyncio.to_thread(self._delete, response_id)

    async def close(self) -> None:
        with self._lock:
            self._db.close()
