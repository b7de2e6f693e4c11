"""Render a kagtpl project into a temporary folder and import its modules, so a benchmark
measures the generated code itself."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "generator"))
sys.path.insert(0, str(ROOT / "tests"))
from conftest import import_project  # noqa: E402  (the tests' rule: machinery.<name>, other projects' modules out)
from kagtpl import table  # noqa: E402

# the answers of a project for each of `kagtpl table`'s tables (their target column and problem)
TABLE_ANSWERS = {
    "binary": {"problem": "binary", "metric": "auc", "target": "target", "submission": "probs"},
    "multiclass": {"problem": "multiclass", "metric": "logloss", "target": "label", "submission": "probs"},
    "regression": {"problem": "regression", "metric": "rmse", "target": "target", "submission": "label"},
}


def work_dir(prefix: str) -> Path:
    """A new folder under $TMPDIR for one run of a benchmark (its data, projects, decode caches:
    150 MB for detection.py), removed when the benchmark exits. KAGTPL_BENCH_KEEP=1 keeps it, to
    look at a run's logs and files; its path is printed then. A full test suite left ~0.7 GB of
    these in /tmp each run until 2026-12-02."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("KAGTPL_BENCH_KEEP") == "1":
        print(f"WORK: {work} (kept: KAGTPL_BENCH_KEEP=1)")
    else:
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


MODULES = ("train", "engine", "gpu", "hardware", "planner", "probe", "steps", "machine")
EXTRA = {"image": ("images",), "text": ("texts",)}  # task-only modules


def shapes_args() -> argparse.Namespace:
    """The flags of a benchmark on `kagtpl shapes` images under run.py --budget (segmentation, detection)."""
    p = argparse.ArgumentParser()
    p.add_argument("--budget", default="10m")
    p.add_argument("--train", type=int, default=200, help="training images")
    p.add_argument("--test", type=int, default=50, help="held-out images")
    p.add_argument("--size", type=int, default=128, help="image side in pixels")
    p.add_argument("--flags", default="", help="train.py flags for the run, e.g. '--folds 2 --epochs 2' (a smoke)")
    return p.parse_args()


def cpu_project(work: Path, name: str, task: str, data: Path, gpu: str = "cpu") -> Path:
    """`kagtpl new NAME --task TASK --gpu cpu --data DATA` with every default, in work/NAME (`gpu`:
    another --gpu answer, e.g. auto on a card)."""
    from kagtpl import new

    return new.new_project(new.NewAnswers(name=name, task=task, gpu=gpu, data=data, dest=work))


def render(dest: Path, task: str, **answers) -> Path:
    """A project rendered by Copier at HEAD (with uncommitted changes) into `dest`, for the CPU."""
    import copier

    data = {"project_name": "bench", "task": task, "gpu": "cpu", **answers}
    copier.run_copy(str(ROOT), dest, data=data, defaults=True, vcs_ref="HEAD", quiet=True)
    return dest


def table_project(work: Path, kind: str, **answers) -> Path:
    """`kagtpl table`'s `kind` table in work/data and a tabular project for it in work/proj."""
    data = table.write_table(work / "data", kind)
    return render(work / "proj", "tabular", data_dir=str(data), id_col="row_id", **TABLE_ANSWERS[kind], **answers)


def rendered(task: str, extra_modules: tuple = (), **answers):
    """A namespace of a freshly rendered project's modules: .train, .engine, .gpu, .hardware, .planner
    (and .images for an image project), and any `extra_modules` of it (tune, tuning)."""
    dest = render(work_dir(f"kagtpl-bench-{task}-") / "proj", task, **answers)
    return import_project(dest, (*MODULES, *EXTRA.get(task, ()), *extra_modules))


SCORE_LINES = (
    *("TIME PLAN", "GROW", "BATCH", "ANCHORS", "OOF", "POSTPROCESS"),
    *("SUBMISSION", "RUN:", "FOLD", "DONE", "STOPPED"),
)


def held_out_auc(train, solution, sub, labels: list) -> float:
    """A submission's macro ROC-AUC against the truth of the same rows, by the project's own metric
    (`train`: an audio project's train module)."""
    assert list(sub["row_id"]) == list(solution["row_id"])
    return train.macro_auc(solution[labels].to_numpy(), sub[labels].to_numpy())


def run_budget(project: Path, budget: str, flags: tuple = (), device: str = "cpu") -> tuple[str, float]:
    """`python run.py --budget BUDGET --device DEVICE [FLAGS]` in `project`, as a user runs it: prints
    the log's plan, fold and score lines and returns (stdout, wall seconds); exits on a failed run."""
    t0 = time.time()
    command = [sys.executable, "run.py", "--budget", budget, "--device", device, *flags]
    run = subprocess.run(command, cwd=project, capture_output=True, text=True)
    wall = time.time() - t0
    print("\n".join(line for line in run.stdout.splitlines() if line.startswith(SCORE_LINES)))
    if run.returncode:
        sys.exit(f"run.py exited {run.returncode}: {run.stderr[-2000:]}")
    return run.stdout, wall
