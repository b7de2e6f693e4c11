"""tune.py's pruner choice, measured on one search: the same tabular project, search space, trial
count and TPE seed under each pruner, side by side in one run:

- `field notes, before`: PatientPruner(HyperbandPruner(min_resource=1, reduction_factor=3), patience=2),
  the field notes' first setting (it pruned 86.5% of 200 trials);
- `default`: PatientPruner(HyperbandPruner(min_resource=3, reduction_factor=3), patience=4), what
  `--pruner auto` takes when the search has room for Hyperband's brackets;
- `median`: the MedianPruner `--pruner auto` falls back to on small searches;
- `none`: every trial to its last epoch.

For each: the share of trials pruned, the epochs trained in all (the compute the search spent),
the wall time, and the best trial's validation AUC (fold 0, the value optuna optimises).

    python benchmarks/tune_pruners.py [--trials 30] [--epochs 12]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import time

from _project import TABLE_ANSWERS, rendered, table, work_dir


def pruners(epochs: int) -> dict:
    import optuna

    def hyperband(min_resource: int, patience: int):
        inner = optuna.pruners.HyperbandPruner(min_resource=min_resource, max_resource=epochs, reduction_factor=3)
        return optuna.pruners.PatientPruner(inner, patience=patience)

    return {
        "field notes, before": lambda: hyperband(1, 2),
        "default": lambda: hyperband(3, 4),
        "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=2),
        "none": optuna.pruners.NopPruner,
    }


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--epochs", type=int, default=12)
    args = p.parse_args()
    work = work_dir("kagtpl-pruners-")
    data = table.write_table(work / "data", "binary")
    answers = {"data_dir": str(data), "id_col": "row_id", "folds": 3, "epochs": args.epochs, **TABLE_ANSWERS["binary"]}
    m = rendered("tabular", **answers, extra_modules=("tune", "tuning"))
    print(f"{args.trials} trials, {args.epochs} epochs each (patience {args.epochs}: only the pruner stops a trial)")
    print(f"{'pruner':<22} {'pruned':>7} {'epochs':>7} {'wall_s':>7} {'best AUC':>9}")
    for name, make in pruners(args.epochs).items():
        m.tuning.choose_pruner = lambda search, make=make: (make(), "PRUNER: benchmark")  # the one thing varied
        out = io.StringIO()
        t0 = time.time()
        argv = ["--trials", str(args.trials), "--device", "cpu", "--study", name, "--out-dir", str(work / "out")]
        with contextlib.redirect_stdout(out):
            m.tune.main([*argv, "--patience", str(args.epochs)])
        wall = time.time() - t0
        log = out.getvalue()
        trials = re.findall(r"^TUNE: trial=\d+ state=(\w+) value=\S+ steps=(\d+)", log, re.M)
        pruned = sum(state == "PRUNED" for state, _ in trials) / len(trials)
        epochs = sum(int(steps) for _, steps in trials)
        best = float(re.search(r"^TUNE BEST: trial=\d+ AUC=([\d.]+)", log, re.M).group(1))
        print(f"{name:<22} {pruned:>7.0%} {epochs:>7} {wall:>7.1f} {best:>9.4f}")


if __name__ == "__main__":
    main()
