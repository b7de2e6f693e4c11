"""tune.py's storage and workers, measured side by side in one run:

1. storage under 2 parallel writers: optuna's JournalStorage on a file (tune.py's default) vs
   SQLite (`--storage sqlite:///...`), two processes running trials of a trivial objective that
   reports every step (ask, report x steps, tell): the storage is all they do, so its locking
   is what is measured. Trials per minute and the errors raised ("database is locked").
2. the same two storages under real tune.py --workers 2 on a generated tabular project.
3. --workers 1 vs --workers 2 on the same small model (the MLP of a tabular project, CPU):
   finished trials per minute with the pruner off, so every trial does the same work.

    python benchmarks/tune_storage.py [--stress-trials 150] [--trials 16] [--epochs 10]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from _project import table_project, work_dir

STRESS = """
import sys, time, optuna
from optuna.storages.journal import JournalFileBackend
optuna.logging.set_verbosity(optuna.logging.ERROR)
url, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if url.startswith("sqlite"):
    storage = optuna.storages.RDBStorage(url)
else:
    storage = optuna.storages.JournalStorage(JournalFileBackend(url))
study = optuna.load_study(study_name="bench", storage=storage)
done = errors = 0
for _ in range(n):
    try:
        trial = study.ask()
        x = trial.suggest_float("x", -10, 10)
        for step in range(steps):
            trial.report((x - 2) ** 2 + step, step)
            trial.should_prune()
        study.tell(trial, (x - 2) ** 2)
        done += 1
    except Exception as e:
        errors += 1
        print("ERROR", type(e).__name__, str(e).splitlines()[0][:80], flush=True)
print("DONE", done, "ERRORS", errors)
"""


def stress(url: str, trials: int, steps: int) -> tuple[float, int, int]:
    """Two processes on one storage: (trials per minute, trials done, errors)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if url.startswith("sqlite"):
        storage = optuna.storages.RDBStorage(url)
    else:
        storage = optuna.storages.JournalStorage(JournalFileBackend(url))
    optuna.create_study(study_name="bench", storage=storage)
    t0 = time.time()
    cmd = [sys.executable, "-c", STRESS, url, str(trials), str(steps)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    wall = time.time() - t0
    done = sum(int(re.search(r"DONE (\d+)", o).group(1)) for o in outs)
    errors = sum(int(re.search(r"ERRORS (\d+)", o).group(1)) for o in outs)
    return 60 * done / wall, done, errors


def tune(project: Path, study: str, trials: int, *flags: str) -> tuple[float, int, int, str]:
    """One tune.py run: (finished trials per minute, finished, failed trials + lock errors, log)."""
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "tune.py", "--trials", str(trials), "--device", "cpu", "--study", study, *flags],
        cwd=project,
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    log = r.stdout + r.stderr
    states = re.findall(r"TUNE: trial=\d+ state=(\w+)", log)
    finished = sum(s in ("COMPLETE", "PRUNED") for s in states)
    errors = states.count("FAIL") + len(re.findall(r"database is locked", log)) + (r.returncode != 0)
    return 60 * finished / wall, finished, errors, log


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stress-trials", type=int, default=150, help="trials per process in the storage stress")
    p.add_argument("--steps", type=int, default=20, help="reports per stress trial")
    p.add_argument("--trials", type=int, default=16, help="tune.py trials per run")
    p.add_argument("--epochs", type=int, default=10, help="the MLP's epochs in each tune.py trial")
    args = p.parse_args()
    work = work_dir("kagtpl-tune-")

    print(f"1. storage stress: 2 processes x {args.stress_trials} trials, {args.steps} reports each")
    print(f"{'storage':<10} {'trials/min':>11} {'done':>6} {'errors':>7}")
    rates = {}
    for name, url in (("journal", str(work / "stress.journal")), ("sqlite", f"sqlite:///{work / 'stress.db'}")):
        rate, done, errors = stress(url, args.stress_trials, args.steps)
        rates[name] = rate
        print(f"{name:<10} {rate:>11.0f} {done:>6} {errors:>7}")
    print(f"journal / sqlite trials per minute: {rates['journal'] / rates['sqlite']:.2f}x")

    project = table_project(work, "binary", folds=3, epochs=args.epochs)
    print(f"\n2. tune.py --workers 2, {args.trials} trials of the tabular MLP ({args.epochs} epochs, CPU)")
    print(f"{'storage':<10} {'trials/min':>11} {'finished':>9} {'errors':>7}")
    for name, flags in (("journal", []), ("sqlite", ["--storage", f"sqlite:///{work / 'tune.db'}"])):
        rate, finished, errors, _ = tune(project, f"s-{name}", args.trials, "--workers", "2", *flags)
        print(f"{name:<10} {rate:>11.1f} {finished:>9} {errors:>7}")

    print(f"\n3. workers on one machine, {args.trials} trials each, pruner off (equal work per trial)")
    print(f"{'workers':<10} {'trials/min':>11} {'finished':>9} {'errors':>7}")
    by = {}
    for k in (1, 2):
        rate, finished, errors, _ = tune(project, f"w{k}", args.trials, "--workers", str(k), "--pruner", "none")
        by[k] = rate
        print(f"{k:<10} {rate:>11.1f} {finished:>9} {errors:>7}")
    print(f"2 workers / 1 worker trials per minute: {by[2] / by[1]:.2f}x")


if __name__ == "__main__":
    main()
