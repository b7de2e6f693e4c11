"""Issue 57, item 7: growth bounded by what predict.py and serve.py can load. predict.py reads
every checkpoint first (storage.ensemble_checkpoints), now with its weights memory-mapped, so it
holds one model's weights at a time; serve.py keeps the folds it serves loaded, as many as fit
its share of the device (serving.HELD_SHARE); growth stops adding checkpoints past that room in
a competition that is served."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import RUN_ENV, render, run_script


def test_growth_stops_where_serve_py_could_not_hold_one_more_checkpoint(project_modules, tmp_path):
    growth = project_modules.growth
    mb = 10**6
    assert growth.served_room(tmp_path, 100 * mb, 30 * mb, 4) is None  # no kaggle_evaluation/: file-based
    (tmp_path / "kaggle_evaluation").mkdir()
    assert growth.served_room(tmp_path, 100 * mb, 30 * mb, 3) is None  # 90 MB fit
    assert growth.served_room(tmp_path, 100 * mb, 30 * mb, 4) == (
        "serve.py keeps every checkpoint loaded: 4 of 30 MB would pass the 100 MB the device has for them"
    )
    assert growth.served_room(tmp_path, 0, 30 * mb, 40) is None  # no room known: no cap


def test_serve_py_keeps_loaded_the_best_folds_that_fit_its_room(project_modules, tmp_path, capsys):
    serving = project_modules.serving
    checkpoints = [
        (tmp_path / f"model_fold{k}.pth", {"model": {"w": torch.zeros(250_000)}, "config": {}, "val_loss": loss})
        for k, loss in enumerate([0.3, 0.1, 0.2])
    ]  # 1 MB of weights each
    clock = serving.StartClock(time.time(), 900, room=2_500_000)
    loaded = serving.load_folds(checkpoints, lambda path, ckpt: path.name, clock)
    assert [model for _, _, model in loaded] == ["model_fold1.pth", "model_fold2.pth"]  # best first
    assert capsys.readouterr().out.strip() == (
        "SERVE: start-up: 1 fold(s) dropped (model_fold0.pth): 2 fold(s) hold 2 MB and the next 1 MB would pass "
        "the 2 MB the device has for them (50% of its memory)"
    )
    one = serving.load_folds(checkpoints, lambda path, ckpt: path.name, serving.StartClock(time.time(), 900, room=1))
    assert len(one) == 1  # the first always: a server answering from one fold beats none


MEMORY = Path("/sys/fs/cgroup/memory")


def peak_of(cmd: list[str], cwd: Path, cap: int, tmp_path: Path) -> tuple[int, int, str]:
    """`cmd` in a memory cgroup of `cap` bytes: (exit code, peak bytes, its output)."""
    cgroup = MEMORY / f"kagtpl-test-{os.getpid()}-{tmp_path.name}"
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(cap))
        shell = f'echo $$ > "{cgroup / "cgroup.procs"}" && exec "$@"'
        r = subprocess.run(["sh", "-c", shell, "sh", *cmd], cwd=cwd, env=RUN_ENV, capture_output=True, text=True)
        return r.returncode, int((cgroup / "memory.max_usage_in_bytes").read_text()), r.stdout + r.stderr
    finally:
        subprocess.run(["sh", "-c", f'cat "{cgroup / "cgroup.procs"}" | xargs -r kill -9'], check=False)
        time.sleep(0.5)
        cgroup.rmdir()


@pytest.mark.slow
def test_predict_py_ensembles_more_checkpoints_than_its_memory_holds_at_once(tmp_path, digits_dir):
    """Ten checkpoints of ~43 MiB (two folds and their grown seeds: 430 MiB of weights) under a
    memory cap that holds predict.py's imports and half of them: before, every checkpoint's
    weights were read into memory first and the OOM killer ended predict.py; memory-mapped, it
    ensembles all ten."""
    if not os.access(MEMORY, os.W_OK):
        pytest.skip("no cgroup v1 memory controller to cap a process here")
    # resnet18: its 43 MiB checkpoints are what the cap below is sized by (resnet10t's 19 MiB leave
    # predict.py's own working memory, not the weights, deciding whether it fits)
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=2, epochs=1, model="resnet18")
    out = tmp_path / "out"
    run_script(project, "train.py", "--device", "cpu", f"--out-dir={out}", "--no-grow")
    for k in (0, 1):
        ckpt = torch.load(out / f"model_fold{k}.pth", weights_only=True)
        for seed_no in range(2, 6):  # grown seeds, as growth.py names and marks them
            shutil.copy(out / f"model_fold{k}.pth", out / f"model_fold{k}_seed{seed_no}.pth")
            torch.save({**ckpt, "seed_no": seed_no, "complete": True}, out / f"model_fold{k}_seed{seed_no}.pth")
    weights = sum(p.stat().st_size for p in out.glob("model_fold*.pth"))
    code, alone, log = peak_of([sys.executable, "predict.py", "--device", "cpu", "--help"], project, 2**34, tmp_path)
    assert code == 0, log
    # its imports and half the weights: memory-mapped, predict.py peaked at 587 MiB under a 700 MiB cap
    # (609 uncapped); reading every checkpoint into memory first, at 1018 MiB, and the OOM killer
    # took it at 700 (its imports alone: 408 MiB)
    cap = alone + weights // 2 + 2**26
    code, peak, log = peak_of(
        [sys.executable, "predict.py", "--device", "cpu", f"--out-dir={out}"], project, cap, tmp_path / "capped"
    )
    assert code == 0, f"exit {code} under a {cap / 2**20:.0f} MiB cap (peak {peak / 2**20:.0f} MiB)\n{log[-3000:]}"
    assert f"SUBMISSION: {out}/submission.csv (40 rows, 10 fold(s) ensembled)" in log, log[-3000:]
    mib = {name: f"{value / 2**20:.0f} MiB" for name, value in (("peak", peak), ("cap", cap), ("weights", weights))}
    print(f"predict.py: peak {mib['peak']} under a {mib['cap']} cap; {mib['weights']} of weights")
