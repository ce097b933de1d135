"""Process-group housekeeping for the Triton launcher: wait without reaping, kill, find stubs, clean up.

Read from /proc (Linux only), so tests can check for orphans without extra dependencies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from slimserve.serving.triton.server_files import STUB_NAME

SHM_DIR = Path("/dev/shm")
_SHM_PREFIX = b"triton_python_backend_shm_region"


def wait_exit_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has exited, leaving it a zombie (not reaped); True when it exited in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # already reaped
        if info is not None:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def kill_group(pgid: int) -> None:
    """SIGKILL every process in group ``pgid`` (nothing when the group is gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def stub_shm_regions(pgid: int) -> set[str]:
    """Names of the shared-memory regions of the python-backend stubs in group ``pgid``."""
    regions = set()
    for pid in group_members(pgid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(STUB_NAME.encode()) and len(argv) > 2 and argv[2].startswith(_SHM_PREFIX):
            regions.add(argv[2].decode())
    return regions


def wait_group_gone(pgid: int, timeout_s: float) -> None:
    """SIGKILL group ``pgid`` until no live member remains (or ``timeout_s`` passes)."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        kill_group(pgid)
        time.sleep(0.05)


def remove_shm_regions(names: set[str]) -> None:
    """Unlink shared-memory regions of stubs whose server was killed (a clean exit already did)."""
    for name in names:
        with contextlib.suppress(OSError):
            (SHM_DIR / name).unlink()
