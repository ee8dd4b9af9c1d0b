"""`make bench` with every gateway target twice, this checkout's code beside another checkout's
(for example a worktree of main), interleaved in every round, so a change's effect is measured in
one run against the same Triton and the same direct client:

    git worktree add --detach ../base main
    python -m loadtest.bench_against ../base --targets grpc,base-gateway-chat,gateway-chat \\
        --concurrency 16,64,256 --repeat 3

The other checkout's rows are named `base-<target>` and labelled `[base]`; its gateway runs from
that directory with it first on PYTHONPATH, with this checkout's installed packages. Every other
argument is `python -m loadtest.bench`'s.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from loadtest import bench

PREFIX = "base-"


def _targets() -> tuple[bench.BenchTarget, ...]:
    # Each gateway target right after its base twin: the pair is measured seconds apart.
    out = []
    for t in bench.TARGETS:
        if t.kind == "gateway":
            out.append(dataclasses.replace(t, key=PREFIX + t.key, label=t.label + " [base]"))
        out.append(t)
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    base = Path(args.pop(0)).resolve()
    if not (base / "gateway" / "cli.py").is_file():
        print(f"{base} is not a checkout of the gateway", file=sys.stderr)
        return 2
    spawn = bench.spawn_logged

    def spawn_either(
        cmd: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        if not log_path.name.startswith(PREFIX):
            return spawn(cmd, log_path, env)
        # Resolved before the change of directory below (the results directory may be relative).
        log_path = log_path.resolve()
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = str(base)
        # `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH.
        here = os.getcwd()
        os.chdir(base)
        try:
            return spawn(cmd, log_path, env)
        finally:
            os.chdir(here)

    bench.TARGETS = _targets()
    bench.spawn_logged = spawn_either
    return bench.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
