"""The experiments table: every training run appends one row to output/experiments.csv.

    python -m machinery.experiments                     # every run, best CV first
    python -m machinery.experiments --out-dir DIR       # another output folder (on Kaggle: /kaggle/working)

A row: when, the run, the git commit (when the project is a repository), the task, model and
input, batch x accumulation and LR, folds and epochs planned and done, the OOF rows the CV is
over, the CV score (the competition's metric) per fold and overall, the blend's members, the wall
time and why the run stopped. This is the results table Kagglers keep by hand.

A run's row is written when its training starts (`stop`: running (pid N)) and rewritten when it
ends: a run that failed says why (`failed: ...`, `interrupted`), one killed in between (SIGKILL,
out of memory) reads back as `killed (ended without a result)`, one cut short mid-row (a copy
stopped) as `cut short (line N ...)` with no CV. The table project's blend has a
row of its own (model `blend`, its members and weights), written by predict.py. Pure Python
(csv), no torch. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

from . import hardware
from .errors import RunError
from .storage import atomic_write, pid_alive

COLUMNS = [
    "time",
    "run",
    "git",
    "task",
    "model",
    "input",
    "batch",
    "lr",
    "folds_planned",
    "folds_done",
    "seeds",
    "epochs_planned",
    "epochs_done",
    "metric",
    "higher_is_better",
    "cv",
    "fold_scores",
    "oof_rows",
    "members",
    "wall_s",
    "stop",
]
RUNNING = re.compile(r"running \(pid (\d+)\)")


def git_commit(cwd: Path = hardware.PROJECT) -> str:
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
    """The rows; a run still marked running whose process is gone reads as killed. A table that
    does not read (cut short mid-character, a NUL byte, not text) is moved aside with a WARNING,
    never lost, and a new one starts; a folder of its name is left alone (nothing is recorded)."""
    path = Path(path)
    if path.is_dir():
        print(f"WARNING: {path} is a folder, not the experiments table: this run is not recorded")
        return []
    if not path.exists():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = [cut_short(r, reader.line_num) for r in reader if isinstance(r, dict)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        aside = path.with_name(f"{path.stem}.unreadable{path.suffix}")
        os.replace(path, aside)
        print(f"WARNING: {path} does not read ({type(e).__name__}): moved to {aside}; a new table starts")
        return []
    for r in rows:
        m = RUNNING.fullmatch(r.get("stop") or "")
        if m and not pid_alive(int(m.group(1))):
            r["stop"] = "killed (ended without a result)"
    return rows


def cut_short(row: dict, line: int) -> dict:
    """A row with fewer fields than the header was cut short (the table copied or a disk filled
    after it was written). Its last field read may be a number cut mid-way (a CV of 0.98665 read as
    0.98), so it is emptied with the missing ones; the row is kept, ranked last, and says so."""
    fields = {k: v for k, v in row.items() if k is not None}  # None: a longer row's extra fields
    present = [k for k, v in fields.items() if v is not None]
    if len(present) == len(fields):
        return row
    cut = {k: ("" if v is None or k == present[-1] else v) for k, v in fields.items()}  # a line has a field
    return {**cut, "stop": f"cut short (line {line} of the table ends early)"}


def run_id() -> str:
    """A run's id: its start time and process, `20261124-071818-4242` (the JSON log's too)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


@contextlib.contextmanager
def recording(path: Path, row: dict, elapsed, enabled: bool = True):
    """Around a run's training: its row is written at the start (`running (pid N)`) and, when
    the training ends on an exception, rewritten with why (`failure`) and `elapsed()` seconds
    before the exception goes on; the caller writes the row of a run that ends well."""
    if enabled:
        append(path, {**row, "stop": running()})
    try:
        yield
    except BaseException as e:
        if enabled:  # a full disk: the run's own error, raised next, is the one to say
            append_or_say(path, {**row, "wall_s": f"{elapsed():.0f}", "stop": failure(e)}, "still says it is running")
        raise


def running() -> str:
    """The `stop` of a run's row while it trains."""
    return f"running (pid {os.getpid()})"


def failure(error: BaseException) -> str:
    """The `stop` of a run that ended on an exception: its type and first line."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, SystemExit):
        return f"exited {error.code}"
    line = (str(error).strip().splitlines() or [""])[0]
    return f"failed: {type(error).__name__}: {line}"[:160]


def append_or_say(path: Path, row: dict, said: str) -> None:
    """append, or, when the disk refuses the table (a full disk), one WARNING that this run's row
    `said`: the table is the run's record, not its work, and a run that trained every fold ended
    as failed on it."""
    try:
        append(path, row)
    except (OSError, RunError) as why:
        print(f"WARNING: this run's row of {Path(path).name} {said}: {why}")


def append(path: Path, row: dict) -> None:
    """Add one run's row, or replace the row of the same `run` and `model` (the row written when
    it started). The whole file is rewritten atomically, so a kill never loses the table."""
    new = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), **row}
    unknown = set(new) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not experiment columns: {sorted(unknown)}")
    rows, key = read(path), (new.get("run"), new.get("model"))
    if Path(path).is_dir():
        return
    same = next((i for i, r in enumerate(rows) if key[0] and (r.get("run"), r.get("model")) == key), None)
    if same is None:
        rows.append(new)
    else:
        rows[same] = {**new, "time": rows[same]["time"]}  # the row keeps its start time
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


SHOWN = (
    "time", "git", "model", "input", "batch", "lr", "folds_done", "seeds", "epochs_done", "oof_rows", "metric", "cv",
    "fold_scores",
    "members",
)  # fmt: skip


def format_table(rows: list[dict], columns=(*SHOWN, "wall_s", "stop")) -> str:
    cells = [list(columns)] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def other_tables(path: Path, most: int = 3) -> list[str]:
    """The project's other run folders with runs in their table (train.py --out-dir DIR, a dry run's
    output/dry-run), as --out-dir names them from here: what to list when `path` holds none."""
    mine = path.resolve() if path.exists() else None
    folders = []
    for table in hardware.run_files(hardware.PROJECT, "experiments.csv"):
        if table.is_file() and table.resolve() != mine and read(table):
            folders.append(hardware.in_project(str(table.parent.relative_to(hardware.PROJECT))))
    return folders[:most]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--out-dir",
        default=hardware.data_and_output_dirs("", "")[1],
        help="the folder train.py wrote experiments.csv to",
    )
    args = p.parse_args(argv)
    path = Path(args.out_dir) / "experiments.csv"
    rows = read(path)
    if not rows:
        elsewhere = "; ".join(f"python -m machinery.experiments --out-dir {shlex.quote(f)}" for f in other_tables(path))
        given = [] if args.out_dir == p.get_default("out_dir") else ["--out-dir", args.out_dir]
        way = f"other folders have runs: {elsewhere}" if elsewhere else f"run {hardware.command('train.py', *given)}"
        print(f"no runs recorded yet in {path}: {way}")
        return
    print(format_table(ranked(rows)))


if __name__ == "__main__":
    main()
