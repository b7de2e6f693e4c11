"""kagtpl new from an installed wheel (not the checkout): the wheel carries the template."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest
import yaml

from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.onecore]  # build, pip, kagtpl new: one process at a time


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The wheel, and the TMPDIR its build had (hatch_build.py's bundle is made there)."""
    dist, tmp = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("build-tmp")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    return next(dist.glob("kagtpl-*.whl")), tmp


@pytest.fixture(scope="module")
def wheel(built):
    return built[0]


def test_the_build_leaves_nothing_in_tmp(built):
    """The template bundle the wheel carries is made in a temp folder, removed once the wheel is
    written: each build (pip install of a checkout) left 1.3 MB in /tmp until 2026-12-02."""
    wheel, tmp = built
    assert "kagtpl/_template.bundle" in zipfile.ZipFile(wheel).namelist()
    assert list(tmp.iterdir()) == []


def test_wheel_carries_the_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "kagtpl/cli.py",
        "kagtpl/data/digits.npz",
        "kagtpl/_template/copier.yml",
        "kagtpl/_template/template/{% if task == 'image' %}train.py{% endif %}.jinja",
        "kagtpl/_template/template/machinery/engine.py",
        "kagtpl/_template/template/machinery/hardware.py",
        "kagtpl/_template/template/{% if task == 'tabular' %}predict.py{% endif %}",
        "kagtpl/_template.bundle",
    ):
        assert name in names


def test_new_from_installed_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(site), "KAGTPL_HOME": str(tmp_path / "home")}
    r = subprocess.run(
        [sys.executable, "-m", "kagtpl", "new", "from-wheel", "--task", "image", "--gpu", "t4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    answers = yaml.safe_load((tmp_path / "from-wheel" / ".copier-answers.yml").read_text())
    # rendered from the wheel's git bundle, copied to a stable per-user path (not the checkout)
    assert answers["_src_path"] == str(tmp_path / "home" / "template.bundle")
    assert answers["_commit"]
    committed = subprocess.run(
        ["git", "show", "HEAD:template/machinery/engine.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert (tmp_path / "from-wheel" / "machinery" / "engine.py").read_text() == committed.stdout
