"""A disk that fills under a server's events file: a real small tmpfs, or an injected ENOSPC.

``TmpfsDisk`` mounts a tmpfs of ``size`` bytes (needs root and a kernel that allows the mount;
``try_mount`` says whether it can), puts the events file on it, fills the rest with a filler
file on ``fill()`` and frees it on ``free()``. tmpfs allocates whole pages, so the events file's
last page still has room when the filler has taken every free page (measured: two ~700-byte
events still fit); ``fill`` takes that room too, with newlines appended to the events file (a
blank line is no record: every reader skips it), so the next event write fails with ENOSPC.
(A tmpfs write that runs out part-way writes what fits first: a 1 MiB tmpfs took 576 bytes of a
1,000-byte write. The injected fault below covers that cut-line path.)

``InjectedDisk`` is the fallback where no mount is allowed (CI runners): the server starts with
``CACHE_POLICY_FAULTS=events.write@N,events.write@N`` so the events writer's N-th and next writes act as a full disk
(half the line written, then ENOSPC; ``serving/jsonl_append.py``). ``fill``/``free`` only check
that the writes meant to fail are the ones in the window.

Both record how many event writes the window should lose, which the chaos checks compare with
what the server logged and what the report counts as missing.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

TMPFS_BYTES = 4 * 1024 * 1024  # events of a chaos run are a few hundred bytes each


def fill_file(path: Path, byte: bytes) -> int:
    """Append ``byte`` to ``path`` until the disk refuses even one; the bytes written."""
    written, block = 0, 65536
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                written += os.write(fd, byte * block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if block == 1:
                    return written
                block //= 2
    finally:
        os.close(fd)


def try_mount(where: Path, size: int = TMPFS_BYTES) -> bool:
    """Mount a tmpfs at ``where`` (created); False when this machine does not allow it."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    return done.returncode == 0


class TmpfsDisk:
    kind = "tmpfs"

    def __init__(self, mount: Path):
        self.mount = mount
        self.filler = mount / "filler.bin"
        self.events = mount / "events.jsonl"

    def events_dir(self) -> Path:
        return self.mount

    def server_env(self, lost_from: int, lost: int) -> dict[str, str]:
        return {}

    def fill(self) -> int:
        """Fill the tmpfs to the last byte (the filler, then the events file's last page with
        newlines); the bytes written."""
        return fill_file(self.filler, b"\0") + fill_file(self.events, b"\n")

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        self.free()
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)


class InjectedDisk:
    kind = "injected ENOSPC"

    def __init__(self, folder: Path):
        self.folder = folder

    def events_dir(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder

    def server_env(self, lost_from: int, lost: int) -> dict[str, str]:
        """The fault items that make event writes ``lost_from`` .. ``lost_from + lost - 1`` fail."""
        # items of one step count the calls no earlier item took: N repeated k times loses N .. N+k-1
        return {"CACHE_POLICY_FAULTS": ",".join([f"events.write@{lost_from}"] * lost)}

    def fill(self) -> int:
        return 0

    def free(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_disk(folder: Path, allow_mount: bool = True):
    """A ``TmpfsDisk`` at ``folder`` when it can be mounted, else an ``InjectedDisk``."""
    if allow_mount and try_mount(folder):
        return TmpfsDisk(folder)
    return InjectedDisk(folder)
