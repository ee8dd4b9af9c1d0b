"""deploy/bundle_host.py: the slim tritonserver takes only the bundled libraries ldd resolves."""

from __future__ import annotations

from deploy.bundle_host import _site_root, resolved_libraries


def test_ldd_resolves_the_bundled_libraries_tritonserver_needs_and_no_others() -> None:
    package, libs_dir = _site_root()
    binaries = [
        package / "tritonserver" / "bin" / "tritonserver",
        package / "tritonserver" / "backends" / "python" / "libtriton_python.so",
    ]
    found, missing = resolved_libraries(binaries, libs_dir)
    names = {p.name for p in found}
    assert any(n.startswith("libtritonserver") for n in names)
    assert all(p.parent == libs_dir.resolve() for p in found)
    # Fewer than the wheel carries: that is the slimming.
    assert len(found) < len(list(libs_dir.iterdir()))
    assert not missing
