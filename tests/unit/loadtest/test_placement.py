"""bench-host's cpu layout: the kernel's cpu lists, physical cores from sysfs, disjoint sets for
workers, Triton and the load generator, and pinning a process tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.placement import (
    CpuPlan,
    PlacementError,
    affinity,
    format_cpu_list,
    parse_cpu_list,
    physical_cores,
    pin_tree,
    plan_cpus,
)


def test_cpu_lists_round_trip() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpu_list([5]) == "5" and format_cpu_list([]) == ""


def _sysfs(tmp_path: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_physical_cores_group_smt_siblings(tmp_path: Path) -> None:
    # Linux numbers the second threads after the first ones: core i is cpus i and i+4.
    root = _sysfs(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    assert physical_cores(range(8), root) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # Only the cpus this process may use; an unreadable topology is a core of its own.
    assert physical_cores([0, 4, 1, 9], root) == [(0, 4), (1,), (9,)]


def _disjoint(plan: CpuPlan) -> None:
    sets = [*plan.workers, plan.triton, plan.loadgen]
    assert sum(len(s) for s in sets) == len({c for s in sets for c in s})


def test_without_smt_each_worker_gets_a_cpu_and_the_rest_is_parted() -> None:
    plan = plan_cpus([(c,) for c in range(16)], workers=8, loadgen_cpus=2)
    assert plan.workers == tuple((c,) for c in range(8))
    assert plan.triton == tuple(range(8, 14)) and plan.loadgen == (14, 15)
    assert not plan.smt and not plan.shared
    _disjoint(plan)
    assert "Triton on 8-13 (6 cpus); load generator on 14-15 (2 cpus)" in plan.describe()


def test_with_smt_workers_get_whole_cores_while_the_rest_suffices() -> None:
    cores = [(c, c + 16) for c in range(16)]  # 16 cores, 32 cpus
    plan = plan_cpus(cores, workers=8, loadgen_cpus=2)
    assert plan.whole_cores and plan.workers[0] == (0, 16) and plan.gateway == (*range(8), *range(16, 24))
    assert len(plan.loadgen) == 2 and len(plan.triton) == 14
    _disjoint(plan)


def test_with_smt_and_few_cores_workers_get_one_thread_each_and_their_siblings_go_to_triton() -> None:
    cores = [(c, c + 8) for c in range(8)]  # 8 cores, 16 cpus
    plan = plan_cpus(cores, workers=8, loadgen_cpus=2)
    assert not plan.whole_cores and plan.workers == tuple((c,) for c in range(8))
    assert plan.triton == tuple(range(8, 14)) and plan.loadgen == (14, 15)
    _disjoint(plan)
    assert "a cpu each on cores of their own" in plan.describe()


def test_too_few_cpus_are_refused_or_shared() -> None:
    with pytest.raises(PlacementError):
        plan_cpus([(0,), (1,)], workers=2, loadgen_cpus=1)
    with pytest.raises(PlacementError):
        plan_cpus([(0, 2), (1, 3)], workers=3, loadgen_cpus=1)
    plan = plan_cpus([(0,), (1,)], workers=1, loadgen_cpus=1)
    assert plan.workers == ((0,),) and plan.triton == plan.loadgen == (1,) and plan.shared
    assert plan.worker_cpus(3) == (0,)  # a gateway with more workers than planned wraps around


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cpus to pin to one of them")
def test_pin_tree_pins_every_thread_of_a_process_and_its_children() -> None:
    cpu = max(os.sched_getaffinity(0))
    code = (
        "import subprocess, sys, threading\n"
        "cmd = [sys.executable, '-c', 'import sys; sys.stdin.read()']\n"
        "child = subprocess.Popen(cmd, stdin=subprocess.PIPE)\n"
        "threading.Thread(target=sys.stdin.read, daemon=True).start()\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert pin_tree(parent.pid, [cpu]) >= 3  # the parent's two threads and the child's one
        tids = [int(t) for t in os.listdir(f"/proc/{parent.pid}/task")]
        assert all(affinity(t) == (cpu,) for t in tids) and affinity(child) == (cpu,)
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(10)
