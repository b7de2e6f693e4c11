"""Trees and the MLP on the realistic tables `kagtpl table` writes, on the same folds: each
model's OOF score and wall time, the hill-climbing blend's OOF score, and the held-out test score
of the blend and of the best single model.

    python benchmarks/tabular_models.py [--kinds binary,multiclass,regression] [--folds 5]

Every model of a table trains in one train.py run (`--models lgbm,xgb,cat,mlp`) on one folds
file; the blend is predict.py's. Held-out answers come from the table's _solution.csv.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import numpy as np
import pandas as pd
from _project import TABLE_ANSWERS as ANSWERS
from _project import table_project, work_dir
from sklearn.metrics import log_loss, mean_squared_error, roc_auc_score

MODELS = ("lgbm", "xgb", "cat", "mlp")


def held_out(kind: str, truth: pd.Series, pred: np.ndarray) -> float:
    if kind == "binary":
        return roc_auc_score(truth, pred[:, -1])
    if kind == "multiclass":
        return log_loss(truth, pred, labels=range(pred.shape[1]))
    return float(np.sqrt(mean_squared_error(truth, pred[:, 0])))


def run_kind(kind: str, folds: int) -> None:
    work = work_dir(f"kagtpl-models-{kind}-")
    project = table_project(work, kind, folds=folds, epochs=50)
    data = work / "data"
    run = subprocess.run(
        [sys.executable, "train.py", "--device", "cpu", "--models", ",".join(MODELS)],
        cwd=project,
        capture_output=True,
        text=True,
    )
    if run.returncode:
        sys.exit(run.stderr[-2000:])
    pred = subprocess.run(
        [sys.executable, "predict.py", "--device", "cpu"], cwd=project, capture_output=True, text=True
    )
    if pred.returncode:
        sys.exit(pred.stderr[-2000:])
    out, metric = project / "output", ANSWERS[kind]["metric"]
    runs = pd.read_csv(out / "experiments.csv").groupby("model").last()
    members = dict(re.findall(r"^BLEND: member (\w+): OOF \w+=([\d.]+)", pred.stdout, re.M))
    weights, blended = re.search(r"^BLEND: weights (.*) -> OOF \w+=([\d.]+)", pred.stdout, re.M).groups()
    solution = pd.read_csv(work / "data_solution.csv")
    sample = pd.read_csv(data / "sample_submission.csv")
    truth = solution.set_index(solution.columns[0]).loc[sample.iloc[:, 0]].iloc[:, 0]
    train = pd.read_csv(data / "train.csv")
    classes = sorted(train[ANSWERS[kind]["target"]].unique()) if kind != "regression" else []
    if classes:
        truth = truth.map({c: i for i, c in enumerate(classes)})
    sub = pd.read_csv(out / "submission.csv").iloc[:, 1:].to_numpy(np.float64)
    test_scores = {}
    for m in MODELS:
        files = [out / "test_mlp.csv"] if m == "mlp" else sorted(out.glob(f"test_{m}_fold*.csv"))
        test_scores[m] = held_out(kind, truth, np.mean([pd.read_csv(f).iloc[:, 1:].to_numpy() for f in files], axis=0))
    print(f"\n{kind}: {len(train)} train rows, {len(sample)} test rows, {folds} folds, metric {metric}")
    print(f"{'model':8s} {'OOF':>9s} {'wall s':>7s} {'held-out test':>14s}")
    for m in MODELS:
        print(f"{m:8s} {float(members[m]):9.4f} {float(runs.loc[m, 'wall_s']):7.0f} {test_scores[m]:14.4f}")
    higher = metric == "auc"
    best = (max if higher else min)(members, key=lambda m: float(members[m]))
    blend_test = held_out(kind, truth, sub if kind != "binary" else np.column_stack([1 - sub[:, 0], sub[:, 0]]))
    print(f"{'blend':8s} {float(blended):9.4f} {'':>7s} {blend_test:14.4f}   weights {weights}")
    print(f"best single model by OOF: {best} ({float(members[best]):.4f}; held-out {test_scores[best]:.4f})")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kinds", default="binary,multiclass,regression")
    p.add_argument("--folds", type=int, default=5)
    args = p.parse_args()
    for kind in args.kinds.split(","):
        run_kind(kind, args.folds)


if __name__ == "__main__":
    main()
