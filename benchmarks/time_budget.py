"""Time budget: a generated project whose configured plan needs >= 5x the budget, run with
run.py under a small budget. Reports total wall time / budget (goal <= 0.97), the share of the
budget spent training (goal >= 0.6), and whether a valid submission was written.

    python benchmarks/time_budget.py [--budget 75]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

import pandas as pd
from _project import ROOT, work_dir

sys.path.insert(0, str(ROOT / "generator"))
from kagtpl import demo  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=75)
    args = p.parse_args()
    import copier

    work = work_dir("kagtpl-bench-budget-")
    data = demo.write_digits(work / "data", n_train=300, n_test=60)
    project = work / "proj"
    answers = {
        "project_name": "proj",
        "task": "image",
        "gpu": "cpu",
        "model": "resnet18",
        "image_size": 32,
        "folds": 5,
        "epochs": 60,
        "data_dir": str(data),
    }
    copier.run_copy(str(ROOT), project, data=answers, defaults=True, vcs_ref="HEAD", quiet=True)
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "run.py", "--budget", f"{args.budget:g}s", "--device", "cpu"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    log = r.stdout
    est = re.search(r"= ([\d.]+) (min|s) for the whole plan", log)
    need = float(est[1]) * (60 if est[2] == "min" else 1) if est else float("nan")
    run = re.search(r"RUN: train ([\d.]+)s, predict ([\d.]+)s", log)
    plan = re.findall(r"^TIME PLAN: .*$", log, re.M)
    valid = False
    try:
        sub = pd.read_csv(project / "output" / "submission.csv")
        sample = pd.read_csv(data / "sample_submission.csv")
        probs = sub[sample.columns[1:]].to_numpy()
        valid = (
            list(sub.columns) == list(sample.columns) and len(sub) == len(sample) and abs(probs.sum(1) - 1).max() < 1e-6
        )
    except (OSError, KeyError, ValueError):
        pass
    print(f"time budget: 5 folds x 60 epochs of resnet18 (digits, 300 images, CPU), budget {args.budget:g}s")
    print(f"configured plan needed {need:.0f}s = {need / args.budget:.1f}x the budget")
    for line in plan:
        print(f"  {line}")
    if run:
        print(f"train {float(run[1]):.1f}s, predict {float(run[2]):.1f}s, total {wall:.1f}s")
        print(f"total wall / budget: {wall / args.budget:.2f}   (goal <= 0.97)")
        print(f"training share of budget: {float(run[1]) / args.budget:.2f}   (goal >= 0.6)")
    print(f"valid submission: {valid}   (exit code {r.returncode})")


if __name__ == "__main__":
    main()
