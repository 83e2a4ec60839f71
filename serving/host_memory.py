"""The host's free memory, from ``/proc/meminfo`` (where SCR's stores go on a CPU server)."""

from __future__ import annotations


def meminfo(text: str) -> tuple[int, int] | None:
    """``(MemAvailable, MemTotal)`` in bytes from the text of ``/proc/meminfo``, or None when either
    is missing (an old kernel, another OS)."""
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in ("MemAvailable", "MemTotal") and parts and parts[0].isdigit():
            values[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    if len(values) < 2:
        return None
    return values["MemAvailable"], values["MemTotal"]


def host_free_memory(path: str = "/proc/meminfo") -> tuple[int, int] | None:
    """``meminfo`` of this host; None when it cannot be read."""
    try:
        with open(path) as f:
            return meminfo(f.read())
    except OSError:
        return None
