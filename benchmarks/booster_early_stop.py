"""A table's boosters under --metric accuracy: early stopping on log loss (booster_fits.py's choice
since 2026-12-07) against early stopping on the error itself (its choice before), held-out accuracy.

    python benchmarks/booster_early_stop.py [--splits 10] [--models lgbm,xgb,cat]

Six scikit-learn tables (breast cancer, digits, wine, and three make_classification sets with 10-20%
of labels flipped), each split `--splits` times (seeded, stratified) into training, validation and
held-out rows (56%, 19%, 25%). Each booster is fitted by the generated project's own
booster_fits.fit (train.py's BOOSTER_PARAMS, 0.05 learning rate, up to 2000 trees, patience 100)
on the training rows, early-stopped on the validation rows, and scored on the held-out rows; the
baseline differs only in the metric early stopping watches. The validation accuracy is printed
too: stopping on the error picks the tree where a few validation rows flip, which flatters the
OOF score it reports.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from _project import rendered
from sklearn import datasets
from sklearn.model_selection import train_test_split

ERROR_NAMES = {  # what booster_fits.eval_metric answered for accuracy before: the error, in each library's words
    "lgbm": {"binary": "binary_error", "multiclass": "multi_error"},
    "xgb": {"binary": "error", "multiclass": "merror"},
    "cat": {"binary": "Accuracy", "multiclass": "Accuracy"},
}


def tables() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    make = datasets.make_classification
    return {
        "cancer": datasets.load_breast_cancer(return_X_y=True),
        "digits": datasets.load_digits(return_X_y=True),
        "wine": datasets.load_wine(return_X_y=True),
        "synth2": make(6000, 20, n_informative=8, flip_y=0.1, random_state=1),
        "synth4": make(6000, 20, n_informative=10, n_classes=4, flip_y=0.1, random_state=2),
        "hard2": make(3000, 30, n_informative=5, flip_y=0.2, class_sep=0.6, random_state=3),
    }


def accuracies(fits, name: str, params: dict, stop_on: str, rows: tuple, seed: int) -> tuple[float, float]:
    """(validation, held-out) accuracy of one booster early-stopped on `stop_on`: "loss" (the
    project's eval_metric for accuracy) or "error" (the baseline)."""
    x_tr, y_tr, x_va, y_va, x_te, y_te = rows
    problem = "binary" if len(np.unique(y_tr)) == 2 else "multiclass"
    chosen = fits.eval_metric
    if stop_on == "error":
        fits.eval_metric = lambda name, problem, metric, on_gpu=False: ERROR_NAMES[name][problem]
    try:
        model, seen, _ = fits.fit(name, params, problem, "accuracy", (x_tr, y_tr, x_va, y_va), "cpu", 2, seed, bool)
    finally:
        fits.eval_metric = chosen
    return tuple(float((seen[model.predict_proba(x).argmax(1)] == y).mean()) for x, y in ((x_va, y_va), (x_te, y_te)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--splits", type=int, default=10)
    p.add_argument("--models", default="lgbm,xgb,cat")
    p.add_argument("--tables", default=",".join(tables()), help="a comma-separated subset")
    args = p.parse_args()
    project = rendered("tabular", extra_modules=("booster_fits",), problem="binary", metric="accuracy")
    params = {"rounds": 2000, "lr": 0.05, "early_stop": 100, **project.train.BOOSTER_PARAMS}
    rows = []
    for table, (x, y) in ((k, v) for k, v in tables().items() if k in args.tables.split(",")):
        x = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
        for split in range(args.splits):
            x_fit, x_te, y_fit, y_te = train_test_split(x, y, test_size=0.25, random_state=split, stratify=y)
            x_tr, x_va, y_tr, y_va = train_test_split(
                x_fit, y_fit, test_size=0.25, random_state=100 + split, stratify=y_fit
            )
            split_rows = (x_tr, y_tr, x_va, y_va, x_te, y_te)
            for name in args.models.split(","):
                for stop_on in ("error", "loss"):
                    va, te = accuracies(project.booster_fits, name, params, stop_on, split_rows, split)
                    rows.append({"table": table, "split": split, "model": name, "on": stop_on, "val": va, "test": te})
    report(pd.DataFrame(rows).pivot_table(index=["table", "split", "model"], columns="on", values=["val", "test"]))


def report(df: pd.DataFrame) -> None:
    """A line a table and booster (mean accuracies over the splits), then the count over every fit."""
    print(f"{'table':8s} {'model':5s} {'held-out, error':>16s} {'held-out, loss':>15s} {'gain':>7s}", end="")
    print(f" {'val, error':>11s} {'val, loss':>10s}")
    for (table, model), g in df.groupby(level=["table", "model"]):
        t, v = g["test"].mean(), g["val"].mean()
        print(f"{table:8s} {model:5s} {t['error']:16.4f} {t['loss']:15.4f} {t['loss'] - t['error']:+7.4f}", end="")
        print(f" {v['error']:11.4f} {v['loss']:10.4f}")
    gain = df["test"]["loss"] - df["test"]["error"]
    print(
        f"held-out accuracy, stopping on log loss against the error: higher in {(gain > 0).sum()} of {len(gain)} "
        f"fits, lower in {(gain < 0).sum()}, the same in {(gain == 0).sum()}; "
        f"{100 * gain.mean():+.2f} points on average"
    )


if __name__ == "__main__":
    main()
