"""Where `make bench-host` runs each process: gateway workers, Triton and the load generator on
disjoint CPU sets (a physical core per worker where SMT would put two on one), and the pinning itself.

Left to the scheduler, the three compete for the same cores and a worker can share a physical core
with Triton's engines through its SMT sibling, so a worker's CPU per token depends on its neighbours.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest import procstat

_SYS_CPU = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The kernel's list format ("0-3,8,10-11") as sorted cpu numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part.strip():
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Sorted cpus in the kernel's list format, runs collapsed ("0-3,8")."""
    out: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(cpu)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def physical_cores(allowed: Iterable[int] | None = None, root: Path = _SYS_CPU) -> list[tuple[int, ...]]:
    """The cpus this process may use, grouped by physical core (SMT siblings together), in cpu order.
    A cpu whose topology cannot be read is a core of its own."""
    usable = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    cores: dict[tuple[int, ...], None] = {}
    for cpu in usable:
        try:
            siblings = parse_cpu_list((root / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            siblings = (cpu,)
        core = tuple(c for c in siblings if c in usable) or (cpu,)
        cores[core] = None
    return sorted(cores, key=lambda c: c[0])


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """Disjoint cpu sets: `workers[i]` for gateway worker i (of every gateway: they are measured in
    turn, never at once), Triton's and the load generator's. `whole_cores`: each worker has a physical
    core to itself (its SMT siblings too); else each has one cpu of a core of its own and the siblings
    went to Triton and the load generator. `shared`: Triton and the load generator share their cpus
    (too few to part)."""

    workers: tuple[tuple[int, ...], ...]
    triton: tuple[int, ...]
    loadgen: tuple[int, ...]
    smt: bool
    whole_cores: bool
    shared: bool = False

    @property
    def gateway(self) -> tuple[int, ...]:
        return tuple(sorted({c for cpus in self.workers for c in cpus}))

    def worker_cpus(self, index: int) -> tuple[int, ...]:
        return self.workers[index % len(self.workers)]

    def describe(self) -> str:
        workers = " ".join(format_cpu_list(w) for w in self.workers)
        kind = "a physical core each" if self.whole_cores else "a cpu each on cores of their own"
        if not self.smt:
            kind = "a cpu each (no SMT)"
        return (
            f"gateway workers on cpus [{workers}] ({kind}; the supervisor on their union); "
            f"Triton on {format_cpu_list(self.triton)} ({len(self.triton)} cpus); load generator on "
            f"{format_cpu_list(self.loadgen)} ({len(self.loadgen)} cpus)"
            + ("; Triton and the load generator share their cpus" if self.shared else "")
        )


class PlacementError(ValueError):
    """The host has too few cpus for the asked layout."""


def plan_cpus(cores: Sequence[tuple[int, ...]], workers: int, loadgen_cpus: int) -> CpuPlan:
    """Workers on the first cores (a whole physical core each while the rest still gives the load
    generator its cpus and Triton at least as many, else one cpu of each); the load generator on the
    last cpus; Triton on the rest. Raises PlacementError when the workers cannot have a physical core
    each, or nothing is left beside them."""
    if workers < 1 or loadgen_cpus < 1:
        raise PlacementError("at least one worker and one load-generator cpu")
    smt = any(len(c) > 1 for c in cores)
    total = sum(len(c) for c in cores)
    if len(cores) < workers or total < workers + 1:
        raise PlacementError(
            f"{len(cores)} physical cores ({total} cpus) cannot give {workers} workers a core of "
            "their own and leave a cpu for Triton and the load generator"
        )
    rest_whole = [c for core in cores[workers:] for c in core]
    whole = len(rest_whole) >= 2 * loadgen_cpus or not smt
    if whole:
        worker_sets = tuple(tuple(core) for core in cores[:workers])
        pool = rest_whole
    else:
        worker_sets = tuple((core[0],) for core in cores[:workers])
        # The workers' siblings first (Triton gets them), the spare cores' cpus last (load generator).
        pool = [c for core in cores[:workers] for c in core[1:]] + rest_whole
    if len(pool) < 2:
        return CpuPlan(worker_sets, tuple(pool), tuple(pool), smt, whole and smt, shared=True)
    take = min(loadgen_cpus, len(pool) - 1)
    return CpuPlan(worker_sets, tuple(sorted(pool[:-take])), tuple(sorted(pool[-take:])), smt, whole and smt)


def pin_tree(pid: int, cpus: Iterable[int], *, descendants: bool = True) -> int:
    """Pin every thread of pid (and of its descendants) to cpus; threads started later inherit it.
    Returns how many threads were pinned (processes that exit meanwhile are skipped)."""
    mask = set(cpus)
    pids = [pid, *procstat.descendants(pid)] if descendants else [pid]
    pinned = 0
    for p in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(tid, mask)
                pinned += 1
    return pinned


def affinity(pid: int) -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(pid)))
