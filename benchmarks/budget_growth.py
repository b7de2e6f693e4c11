"""Budget growth (issue 48): the default image project and the default table project, each under
run.py --budget twice on the same folds, with growth (the default) and with --no-grow. For each
run it reports the share of the budget used, the held-out score and the difference between the two.

    python benchmarks/budget_growth.py [--image-budget 10m] [--table-budget 90s] [--images 600]
    python benchmarks/budget_growth.py --tasks image,table    # without the loaded table's 3 minutes
    python benchmarks/budget_growth.py --device cuda --tasks image --image-budget 90s --images 1200   # on a card

The image project is `kagtpl new --task image --gpu cpu` with every default on the digits (held-out
log loss, lower is better); the table is `kagtpl table binary` with every default (held-out
ROC-AUC, the competition's metric). Both copies of a project are rendered from the same data and
seed, so their folds file is the same. Goals on a CPU: >= 0.85 of the budget used, the held-out
score better with growth, no run over its budget. The table's budget is 90 s: its 456 rows train
every model's 5 seeds (the cap) in ~85 s, so under 2m it ended at 0.71-0.79 with every model
capped. When growth chose more TTA views, the growth run's checkpoints are predicted again with
the plan's views, and the difference is printed.

`loaded` (issue 57, item 1): the table once more under run.py --budget 3m with a busy loop on every
core beside it (the re-plans flip on a loaded machine), and one line: the MLP's folds of the split
trained before its first grown seed, the TIME PLAN lines, and the rows of its OOF.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
from _project import cpu_project, run_budget, work_dir  # first: it puts kagtpl's generator on the path
from gpu_tasks import budget_share, grown_folds

from kagtpl import demo, table


def held_out_table(project: Path, solution: Path, name: str = "submission.csv") -> float:
    from sklearn.metrics import roc_auc_score

    sub = pd.read_csv(project / "output" / name).set_index("row_id")
    truth = pd.read_csv(solution)
    return roc_auc_score(truth["target"], sub.loc[truth["row_id"], "target"])


def held_out_image(project: Path, solution: Path, name: str = "submission.csv") -> float:
    return demo.score(project / "output" / name, solution)["logloss"]


def plan_views_score(project: Path, log: str, score, device: str) -> float | None:
    """The held-out score of the same checkpoints with the plan's TTA views: predict.py again with
    growth's choice (output/tta_views.json) moved aside; None when growth kept the plan's views."""
    chosen = project / "output" / "tta_views.json"
    if "GROW: TTA views " not in log or "GROW: TTA views stay" in log or not chosen.is_file():
        return None
    aside = chosen.with_name("tta_views.aside")
    chosen.rename(aside)
    try:
        command = [sys.executable, "predict.py", "--device", device, "--submission", "plan_views.csv"]
        subprocess.run(command, cwd=project, capture_output=True, text=True, check=True)
    finally:
        aside.rename(chosen)
    return score(project, "plan_views.csv")


def run_pair(work: Path, task: str, data: Path, budget: str, flags: tuple, score, device: str) -> list[dict]:
    """The same project twice (growth, --no-grow): each run's share of the budget, seeds grown and score."""
    rows = []
    for label, extra in (("growth", ()), ("--no-grow", ("--no-grow",))):
        project = cpu_project(work / label.strip("-"), task, task, data, gpu="cpu" if device == "cpu" else "auto")
        log, wall = run_budget(project, budget, (*flags, *extra), device)
        share, grown = float(budget_share(log)), grown_folds(log)
        # each row's fold, as scored; none when no fold was validated (a budget under one epoch)
        path = project / "output" / "oof.csv"
        oof = pd.read_csv(path, dtype=str) if path.is_file() else pd.DataFrame({"id": [], "fold": []})
        folds = oof[[oof.columns[0], "fold"]].sort_values(oof.columns[0], ignore_index=True)
        rows.append(
            {"run": label, "share": share, "wall": wall, "grown": grown, "score": score(project), "folds": folds}
        )
        if label == "growth":
            rows[-1]["plan_views"] = plan_views_score(project, log, score, device)
    # the plan may cut folds in one run and not the other: the folds both have must hold the same rows
    same = rows[0]["folds"].merge(
        rows[1]["folds"], left_on=rows[0]["folds"].columns[0], right_on=rows[1]["folds"].columns[0]
    )
    assert (same["fold_x"] == same["fold_y"]).all(), "the two runs were not on the same folds"
    return rows


def loaded_table(work: Path, data: Path, budget: str, device: str) -> str:
    """The table under `budget` with a busy loop on every core beside run.py: whether every fold of
    the MLP's split was trained before its first grown seed (a cut plan gets its folds back first)."""
    project = cpu_project(work / "loaded", "tabular", "tabular", data, gpu="cpu" if device == "cpu" else "auto")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        log, _ = run_budget(project, budget, (), device)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    lines = log.splitlines()
    split = re.search(r"^FOLD 0 \(1 of (\d+)\)", log, re.M)  # the MLP's first fold: the configured plan
    done = [i for i, line in enumerate(lines) if re.match(r"FOLD \d+ DONE: ", line)]
    trained = sorted({int(re.match(r"FOLD (\d+)", lines[i])[1]) for i in done})
    seed = next((i for i, line in enumerate(lines) if re.match(r"GROW: seed \d fold \d+ \(", line)), None)
    before = seed is None or all(i < seed for i in done)
    oof = re.findall(r"^OOF: .* over (\d+) rows from folds \[[\d, ]*\] \(mlp\)$", log, re.M)
    plans = sum(line.startswith("TIME PLAN") for line in lines)
    planned, grown = split[1] if split else "?", "none grown" if seed is None else "seeds grown"
    return (
        f"table under load ({budget}, {len(loops)} busy loops): the MLP trained folds {trained} of the {planned} "
        f"planned {'before' if before else 'NOT before'} its first grown seed ({grown}); {plans} TIME PLAN lines; "
        f"its OOF over {oof[-1] if oof else '?'} rows; budget used {budget_share(log) or '?'}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image-budget", default="10m")
    p.add_argument("--table-budget", default="90s", help="2m: every model reaches the 5-seed cap in ~85 s")
    p.add_argument("--images", type=int, default=600, help="digit images to train on (the issue's 600)")
    p.add_argument("--tasks", default="image,table,loaded", help="image, table, loaded (the table beside busy loops)")
    p.add_argument("--loaded-budget", default="3m", help="the loaded table's (the issue's 3m)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: rendered with --gpu auto")
    args = p.parse_args()
    work = work_dir("kagtpl-bench-growth-")
    digits = demo.write_digits(work / "digits", n_train=args.images, n_test=200)
    tab = table.write_table(work / "table", "binary")
    tasks, results = args.tasks.split(","), {}
    if "image" in tasks:
        results[f"image ({args.image_budget}, held-out log loss)"] = run_pair(
            work / "image", "image", digits, args.image_budget, ("--no-pretrained",),
            lambda proj, name="submission.csv": held_out_image(proj, work / "digits_solution.csv", name), args.device,
        )  # fmt: skip
    if "table" in tasks:
        results[f"table ({args.table_budget}, held-out AUC)"] = run_pair(
            work / "table-runs", "tabular", tab, args.table_budget, (),
            lambda proj, name="submission.csv": held_out_table(proj, work / "table_solution.csv", name), args.device,
        )  # fmt: skip
    print(f"\n{'project':36}{'run':12}{'budget used':>12}{'grown folds':>13}{'held-out':>10}")
    for name, (grown, plain) in results.items():
        for r in (grown, plain):
            print(f"{name:36}{r['run']:12}{r['share']:>12.2f}{r['grown']:>13}{r['score']:>10.4f}")
        better = grown["score"] < plain["score"] if "log loss" in name else grown["score"] > plain["score"]
        print(
            f"{'':36}growth - no-grow: {grown['score'] - plain['score']:+.4f} ({'better' if better else 'not better'})"
        )
        if grown.get("plan_views") is not None:  # the same checkpoints with the plan's TTA views
            print(f"{'':36}growth's TTA views - the plan's: {grown['score'] - grown['plan_views']:+.4f}")
    over = [f"{n} {r['run']}" for n, rs in results.items() for r in rs if r["share"] > 1.0]
    print(f"runs over their budget: {', '.join(over) or 'none'}")
    if "loaded" in tasks:
        print(loaded_table(work, tab, args.loaded_budget, args.device))


if __name__ == "__main__":
    main()
