"""Build and install the native engine (`engines/native/`): a Triton backend in C that serves the
`tensorrt_llm` engine contract with synthetic tokens, at the C API's cost per streamed response.

``python -m deploy.native_engine build`` (`make native-engine`) compiles it with gcc (C11, -O2, only
libc) into ``build/native/``; ``install_backend`` puts it where tritonserver looks for backends
(``<backends>/native_engine/libtriton_native_engine.so``), building it first when the library is
missing or older than its sources; ``token_id_ranges`` gives the ids it emits, the CPU reference
engine's synthetic candidates, as the ``token_ids`` model parameter.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

ROOT: Final = Path(__file__).resolve().parent.parent
SOURCE_DIR: Final = ROOT / "engines" / "native"
BUILD_DIR: Final = ROOT / "build" / "native"
BACKEND_NAME: Final = "native_engine"
LIBRARY_NAME: Final = f"libtriton_{BACKEND_NAME}.so"
# C11, no C++ runtime, only libc (pthreads are in it since glibc 2.34; -pthread keeps older ones).
CFLAGS: Final = (
    "-std=c11",
    "-O2",
    "-shared",
    "-fPIC",
    "-pthread",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
)


class NativeEngineError(RuntimeError):
    """The native engine cannot be built or installed; the message says why."""


def sources() -> list[Path]:
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".c", ".h"))


def library_path(build_dir: Path = BUILD_DIR) -> Path:
    return build_dir / LIBRARY_NAME


def is_stale(library: Path) -> bool:
    """Whether the library is missing or older than a source file."""
    if not library.exists():
        return True
    built = library.stat().st_mtime
    return any(source.stat().st_mtime > built for source in sources())


def build(build_dir: Path = BUILD_DIR, *, force: bool = False, compiler: str | None = None) -> Path:
    """Compile the backend into ``build_dir`` unless it is up to date; returns the library's path."""
    library = library_path(build_dir)
    if not force and not is_stale(library):
        return library
    cc = compiler or os.environ.get("CC") or "gcc"
    if shutil.which(cc) is None:
        raise NativeEngineError(f"building the native engine needs a C compiler ({cc} is not on PATH)")
    build_dir.mkdir(parents=True, exist_ok=True)
    # Compiled beside the target and renamed into place: a running tritonserver's copy is never torn.
    fd, partial = tempfile.mkstemp(prefix=f".{LIBRARY_NAME}.", dir=build_dir)
    os.close(fd)
    c_files = [str(p) for p in sources() if p.suffix == ".c"]
    command = [cc, *CFLAGS, "-o", partial, *c_files]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        Path(partial).unlink(missing_ok=True)
        raise NativeEngineError(f"{' '.join(command)} failed:\n{result.stderr.strip()}")
    Path(partial).chmod(0o755)
    os.replace(partial, library)
    logger.info("built %s", library)
    return library


def install_backend(backends_dir: Path) -> Path:
    """Make ``backends_dir/native_engine/libtriton_native_engine.so`` present: a library already there
    (a host bundle carries one, prebuilt) is kept; otherwise the built one (built first if stale)."""
    target = backends_dir / BACKEND_NAME / LIBRARY_NAME
    if target.exists():
        return target
    library = build()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, target)
    return target


def serves_native(repositories: Iterable[Path]) -> bool:
    """Whether a model of these repositories runs on the native engine backend."""
    marker = f'backend: "{BACKEND_NAME}"'
    for repository in repositories:
        for config in Path(repository).glob("*/config.pbtxt"):
            if marker in config.read_text(errors="replace"):
                return True
    return False


def ranges(ids: Sequence[int]) -> str:
    """Ascending ids as ranges: [3, 4, 5, 9] -> "3-5,9"."""
    parts: list[str] = []
    start = previous = None
    for token in ids:
        if previous is not None and token == previous + 1:
            previous = token
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = token
    if start is not None:
        parts.append(str(start) if start == previous else f"{start}-{previous}")
    return ",".join(parts)


def token_id_ranges(tokenizer_dir: Path | str) -> str:
    """The ids the engine emits, as ranges: the CPU reference engine's synthetic-mode rule itself
    (`ordinary_token_ids`: ordinary tokens that are whole printable text on their own), so that both
    engines give the same tokens for the same prompt and seed."""
    from transformers import AutoTokenizer

    from deploy.model_repo import load_reference_engine

    ids = load_reference_engine().ordinary_token_ids(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    if not ids:
        raise NativeEngineError(f"no ordinary tokens in the tokenizer of {tokenizer_dir}")
    return ranges(ids)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.native_engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help=f"compile the backend into {BUILD_DIR.relative_to(ROOT)}/")
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(build(force=args.force))
    except NativeEngineError as exc:
        logger.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
