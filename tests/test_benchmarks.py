"""Smoke runs of benchmarks/: each script runs on a small size and prints its table, so none
can rot. They assert no speed (timings here are noisy); docs/performance.md holds the figures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, RUN_ENV

pytestmark = pytest.mark.slow


def bench(script, *args):
    r = subprocess.run(
        [sys.executable, script, *args],
        cwd=ROOT / "benchmarks",
        env=RUN_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def test_tabular_batching_smoke():
    out = bench("tabular_batching.py", "--rows", "20000")
    assert "batching only, batches/s" in out and "MLP epoch" in out and "x" in out


def test_training_loop_smoke():
    out = bench("training_loop.py", "--images", "64", "--size", "32", "--batch", "16", "--rounds", "1")
    assert "kagtpl train.py loop" in out and "bare PyTorch loop" in out and "vs bare loop" in out


def test_image_pipeline_smoke():
    out = bench("image_pipeline.py", "--images", "40", "--jpeg-size", "64", "--size", "32", "--batch", "8")
    assert "decode cache (kagtpl)" in out and "PIL decode every epoch" in out and "ratio:" in out


def test_generator_latency_smoke():
    out = bench("generator_latency.py", "--rounds", "1")
    assert "kagtpl new" in out and "copier copy" in out and "ratio kagtpl / copier" in out


def test_time_budget_smoke():
    out = bench("time_budget.py", "--budget", "45")
    assert "total wall / budget" in out and "valid submission: True" in out
