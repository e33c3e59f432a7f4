"""The install prints no packaging warning: every folder of the two packages is a package, and a wheel built from
the checkout carries the C sources the kernels compile at first use."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("echorl_envs", "echorl_agent")


def _folders() -> list[Path]:
    return sorted(d for pkg in PACKAGES for d in [ROOT / pkg, *(ROOT / pkg).rglob("*")]
                  if d.is_dir() and d.name != "__pycache__" and not d.name.startswith(".")
                  and any(f.is_file() for f in d.iterdir()))


def test_every_folder_of_the_packages_is_a_package():
    """setuptools warns "Package 'x.y' is absent from the `packages` configuration" for a folder without
    ``__init__.py`` whose files are package data (it was echorl_agent/replay/kernels)."""
    assert [d.relative_to(ROOT).as_posix() for d in _folders() if not (d / "__init__.py").is_file()] == []


def test_package_data_patterns_match_files():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    for pkg, patterns in cfg["options.package_data"].items():
        for pattern in (p.strip() for p in patterns.split(",")):
            assert list((ROOT / pkg).glob(pattern)), f"package_data {pkg}: {pattern} matches no file"


@pytest.mark.slow
def test_a_wheel_builds_without_warnings_and_ships_the_c_sources(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    names = zipfile.ZipFile(next(tmp_path.glob("echorl-*.whl"))).namelist()
    assert {"echorl_agent/replay/kernels/sumtree.c", "echorl_agent/llm/quant/qlinear.c", "echorl_agent/py.typed",
            "echorl_envs/py.typed"} <= set(names)
