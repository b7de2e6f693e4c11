"""Recipe quality on small data: a generated image project with its defaults under
`python run.py --budget 10m` on CPU, against a tuned scikit-learn baseline on the same images,
both scored by log loss on the same held-out test images (which neither sees in training).

    python benchmarks/small_data_recipe.py [--train 600] [--budget 10m]

The data: kagtpl's built-in digits (UCI, 8x8 scans upscaled to 32 px JPEGs), `--train` training
images and 297 held-out. The project: `kagtpl new --task image --gpu cpu --data ...` with no
other flag (the image size comes from the data). The baseline: the same JPEGs as grey pixels,
standardised, LogisticRegression with C chosen by 5-fold grid search on log loss.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _project import ROOT, work_dir
from PIL import Image

sys.path.insert(0, str(ROOT / "generator"))
from kagtpl import demo  # noqa: E402


def pixels(folder: Path, ids) -> np.ndarray:
    return np.stack([np.asarray(Image.open(folder / f"{i}.jpg").convert("L"), np.float32).ravel() for i in ids])


def baseline(data: Path, solution: pd.DataFrame) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    labels = pd.read_csv(data / "labels.csv", dtype=str)
    x, y = pixels(data / "train", labels["id"]), labels["breed"]
    grid = GridSearchCV(
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000)),
        {"logisticregression__C": [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0]},
        scoring="neg_log_loss",
        cv=5,
    )
    grid.fit(x, y)
    probs = grid.predict_proba(pixels(data / "test", solution["id"]))
    return log_loss(solution["breed"], probs, labels=grid.classes_), grid.best_params_["logisticregression__C"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=int, default=600)
    p.add_argument("--budget", default="10m")
    args = p.parse_args()
    work = work_dir("kagtpl-bench-recipe-")
    data = demo.write_digits(work / "data", n_train=args.train, n_test=297)
    solution = pd.read_csv(work / "data_solution.csv", dtype=str)
    new = subprocess.run(
        [sys.executable, "-m", "kagtpl", "new", "digits", "--task", "image", "--gpu", "cpu", "--data", str(data)],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert new.returncode == 0, new.stderr
    t0 = time.time()
    run = subprocess.run(
        [sys.executable, "run.py", "--budget", args.budget, "--device", "cpu"],
        cwd=work / "digits",
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    ours = demo.score(work / "digits" / "output" / "submission.csv", work / "data_solution.csv")
    base, c = baseline(data, solution)
    size = re.search(r"Image size: .*", new.stdout)
    oof = re.search(r"^OOF: .*$", run.stdout, re.M)
    budget_line = re.search(r"^RUN: .*$", run.stdout, re.M)
    print(f"small-data recipe: digits, {args.train} training images, 297 held out, CPU, run.py --budget {args.budget}")
    print(f"  {size.group(0) if size else ''}")
    print(f"  {oof.group(0) if oof else 'no OOF line'}")
    print(f"  {budget_line.group(0) if budget_line else ''} ({wall:.0f}s)")
    print(f"{'':40}{'held-out log loss':>18}{'accuracy':>10}")
    print(f"{'kagtpl project (defaults)':40}{ours['logloss']:18.4f}{ours['accuracy']:10.4f}")
    print(f"{f'LogisticRegression (C={c}, grid-searched)':40}{base:18.4f}")
    print(f"ratio baseline / kagtpl log loss: {base / ours['logloss']:.2f}x   (goal > 1: kagtpl better)")


if __name__ == "__main__":
    main()
