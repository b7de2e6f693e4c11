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
