"""The experiments table: every training run appends one row to output/experiments.csv.

    python -m machinery.experiments                     # every run, best CV first
    python -m machinery.experiments --out-dir DIR       # another output folder (on Kaggle: /kaggle/working)

A row: when, the git commit (when the project is a repository), the task, model and input,
batch x accumulation and LR, folds and epochs planned and done, the CV score per fold and
overall, the wall time and why the run stopped. This is the results table Kagglers keep by
hand. Pure Python (csv), no torch. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import time
from pathlib import Path

from . import hardware
from .storage import atomic_write

COLUMNS = [
    "time",
    "git",
    "task",
    "model",
    "input",
    "batch",
    "lr",
    "folds_planned",
    "folds_done",
    "epochs_planned",
    "epochs_done",
    "metric",
    "higher_is_better",
    "cv",
    "fold_scores",
    "wall_s",
    "stop",
]


def git_commit(cwd: Path = Path(".")) -> str:
    """The short commit of the project's repository ('' when it is none), '+' when edited since."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return sha + ("+" if dirty else "")


def read(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append(path: Path, row: dict) -> None:
    """Add one run; the whole file is rewritten atomically, so a kill never loses the table."""
    rows = [*read(path), {"time": time.strftime("%Y-%m-%d %H:%M:%S"), **row}]
    unknown = set(rows[-1]) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not experiment columns: {sorted(unknown)}")
    text = io.StringIO()
    writer = csv.DictWriter(text, COLUMNS, restval="")
    writer.writeheader()
    writer.writerows({k: r.get(k, "") for k in COLUMNS} for r in rows)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text.getvalue()))


def ranked(rows: list[dict]) -> list[dict]:
    """Best CV first, per metric (a run with no score goes last)."""

    def key(r):
        if r.get("cv") in (None, ""):
            return (r.get("metric", ""), 1, 0.0)
        cv = float(r["cv"])
        return (r.get("metric", ""), 0, -cv if r.get("higher_is_better") == "True" else cv)

    return sorted(rows, key=key)


SHOWN = ("time", "git", "model", "input", "batch", "lr", "folds_done", "epochs_done", "metric", "cv", "fold_scores")


def format_table(rows: list[dict], columns=(*SHOWN, "wall_s", "stop")) -> str:
    cells = [list(columns)] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--out-dir",
        default=hardware.data_and_output_dirs("", "")[1],
        help="the folder train.py wrote experiments.csv to",
    )
    args = p.parse_args(argv)
    rows = read(Path(args.out_dir) / "experiments.csv")
    if not rows:
        print(f"no runs recorded yet in {Path(args.out_dir) / 'experiments.csv'}: run train.py")
        return
    print(format_table(ranked(rows)))


if __name__ == "__main__":
    main()
