"""A process-local store: for tests and throwaway runs (lost on restart, not shared by workers)."""

from __future__ import annotations

import time
from collections import OrderedDict

from gateway.store import StoredResponse


class MemoryResponseStore:
    def __init__(self, max_age_s: float | None, max_count: int | None) -> None:
        self._max_age_s = max_age_s
        self._max_count = max_count
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()

    def _expired(self, record: StoredResponse) -> bool:
        return self._max_age_s is not None and record.created_at < time.time() - self._max_age_s

    async def put(self, record: StoredResponse) -> None:
        self._records.pop(record.id, None)
        self._records[record.id] = record
        while self._records and self._expired(next(iter(self._records.values()))):
            self._records.popitem(last=False)
        while self._max_count is not None and len(self._records) > self._max_count:
            self._records.popitem(last=False)

    async def get(self, response_id: str) -> StoredResponse | None:
        record = self._records.get(response_id)
        return None if record is None or self._expired(record) else record

    async def delete(self, response_id: str) -> bool:
        return self._records.pop(response_id, None) is not None

    async def close(self) -> None:
        self._records.clear()
