"""CPU time and resident memory of a process (optionally with its descendants), read from /proc.

The benchmark charges each client-side process (gateway with its workers, proxy, or the load
generator itself for direct gRPC) the CPU it burned while the measured requests ran.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class CpuSample:
    user_s: float
    system_s: float
    processes: int

    @property
    def total_s(self) -> float:
        return self.user_s + self.system_s

    def __sub__(self, other: CpuSample) -> CpuSample:
        return CpuSample(self.user_s - other.user_s, self.system_s - other.system_s, self.processes)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """Live descendants of pid (children first), from each process's parent id."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    stack = list(children.get(pid, ()))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(children.get(child, ()))
    return out


def cpu_times(pid: int, *, include_children: bool = True) -> CpuSample:
    """User and system CPU seconds of pid, plus its live descendants and their reaped children.

    Reaped children's time is in cutime/cstime, so a worker that exits mid-run is still counted.
    For a process measuring itself (include_children=False) the children's fields are left out,
    because its descendants are the servers under test.
    """
    pids = [pid, *descendants(pid)] if include_children else [pid]
    user = system = 0
    seen = 0
    for p in pids:
        fields = _stat_fields(p)
        if fields is None:
            continue
        seen += 1
        # Fields 14-17 of /proc/<pid>/stat: utime, stime, cutime, cstime (index 11.. after the name).
        user += int(fields[11])
        system += int(fields[12])
        if include_children:
            user += int(fields[13])
            system += int(fields[14])
    return CpuSample(user / _TICKS, system / _TICKS, seen)


def rss_bytes(pid: int, *, include_children: bool = False) -> int:
    """Resident set size (sum over the process tree when asked)."""
    pids = [pid, *descendants(pid)] if include_children else [pid]
    total = 0
    for p in pids:
        try:
            resident = int((_PROC / str(p) / "statm").read_text().split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        total += resident * _PAGE
    return total


def _established_inodes(port: int) -> set[int]:
    """Socket inodes of ESTABLISHED TCP connections whose local port is `port` (this namespace)."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXADDR:HEXPORT; state 01 is ESTABLISHED; field 9 the inode.
            if len(fields) > 9 and fields[3] == "01" and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def connections(pids: list[int], port: int) -> tuple[int, ...]:
    """How many established connections to local `port` each process holds open (its sockets' fds):
    where the kernel put the clients' connections among the workers."""
    established = _established_inodes(port)
    counts = []
    for pid in pids:
        n = 0
        try:
            fds = os.listdir(_PROC / str(pid) / "fd")
        except OSError:
            counts.append(0)
            continue
        for fd in fds:
            try:
                link = os.readlink(_PROC / str(pid) / "fd" / fd)
            except OSError:
                continue
            if link.startswith("socket:[") and int(link[8:-1]) in established:
                n += 1
        counts.append(n)
    return tuple(counts)
