"""A least-recently-used cache bounded by the bytes its entries may hold, not by their count.

Why: a cache bounded by count is bounded in memory only if every entry is small. The compiled
``stop_regex`` patterns (``patches/stop_regex.py``) were kept in a 4,096-entry ``lru_cache``; a
client can make each entry megabytes (550 heavy patterns grew each process by ~1.5 GB). Here each
entry is charged what its ``cost`` function says it may hold at most, and the least recently used
entries are dropped until the charges fit the capacity. An entry that alone exceeds the capacity is
returned but not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """``get_or_make(key, make)``: the cached value of ``key``, or ``make()``'s, kept when it fits.
    ``cost(key)`` is the bytes charged for the entry (known before the value is made).
    Thread-safe; ``make`` runs outside the lock (two threads may both make a missing value)."""

    def __init__(self, capacity: int, cost: Callable[[K], int]):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self.cost = cost
        self.charged = 0
        self.evictions = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry[0]
        value = make()  # may raise: nothing is kept then
        self.put(key, value)
        return value

    def put(self, key: K, value: V) -> None:
        charge = self.cost(key)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.charged -= old[1]
            if charge > self.capacity:
                return
            while self._entries and self.charged + charge > self.capacity:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.charged -= dropped
                self.evictions += 1
            self._entries[key] = (value, charge)
            self.charged += charge

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.charged = 0
