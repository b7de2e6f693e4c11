"""README's first command: the built-in demo, end to end on CPU (render, train, predict, score)."""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest

from conftest import RUN_ENV

pytestmark = pytest.mark.slow


def test_demo_end_to_end(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "kagtpl", "demo", str(tmp_path / "demo")],
        env=RUN_ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"DEMO: (\S+) -- held-out test logloss=([\d.]+), accuracy=([\d.]+)", r.stdout)
    assert m, r.stdout[-2000:]
    assert float(m.group(3)) > 0.9 and float(m.group(2)) < 0.5  # 10 classes: chance is 0.1 / 2.30
    sub = pd.read_csv(m.group(1))
    assert len(sub) == 297 and list(sub.columns)[:3] == ["id", "zero", "one"]
    assert re.search(r"^OOF: Acc=[\d.]+, logloss=[\d.]+ over 1500 rows from folds \[0, 1, 2\]$", r.stdout, re.M)

    again = subprocess.run(
        [sys.executable, "-m", "kagtpl", "demo", str(tmp_path / "demo")],
        env=RUN_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1 and "exists and is not empty" in again.stderr
