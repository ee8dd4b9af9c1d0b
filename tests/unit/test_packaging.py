"""pyproject.toml installs without warnings: `make install` (pip install -e .) prints whatever
setuptools warns about while it reads the project table, on every install."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"


def test_setuptools_reads_the_project_table_without_a_warning() -> None:
    pytest.importorskip("setuptools", minversion="77")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), PYPROJECT)
    assert [str(w.message).splitlines()[0] for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"


def test_the_build_requires_a_setuptools_that_takes_an_spdx_license() -> None:
    build = tomllib.loads(PYPROJECT.read_text())["build-system"]["requires"]
    (setuptools,) = [Requirement(r) for r in build if Requirement(r).name == "setuptools"]
    # 77 is the first setuptools that reads `license` as an SPDX expression.
    assert not setuptools.specifier.contains(Version("76.9")) and setuptools.specifier.contains(
        Version("77.0")
    )
