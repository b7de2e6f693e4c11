"""After tune.py's trials: the best trial, output/best_params.json (with the run signature it
was searched with), the summary table and optuna's plots. It is machinery: `copier update` may
replace it.
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from . import hardware, storage

if TYPE_CHECKING:
    from .tuning import Search

STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING")


def best_trial(study):
    """The best COMPLETE trial; with none, the best stopped one (a deadline stop still leaves
    parameters to train with); None when no trial reported a finite value."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False) if t.value is not None and math.isfinite(t.value)]
    if not done:
        pruned = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
        done = [t for t in pruned if t.intermediate_values and math.isfinite(t.intermediate_values[t.last_step])]
        key = lambda t: t.intermediate_values[t.last_step]  # noqa: E731
    else:
        key = lambda t: t.value  # noqa: E731
    if not done:
        return None, None
    pick = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
    best = pick(done, key=key)
    return best, key(best)


def write_best(study, search: Search) -> Path | None:
    """output/best_params.json, atomically: what train.py --params and run.py read."""
    best, value = best_trial(study)
    if best is None:
        return None
    record = {
        "params": best.user_attrs.get("flags", best.params),
        "value": value,
        "metric": search.metric,
        "direction": search.direction,
        "complete": best.state.name == "COMPLETE",
        "trial": best.number,
        "study": search.study_name,
        "folds_per_trial": search.folds,
        "signature": best.user_attrs.get("signature"),  # the run signature the search trained with
        "params_signature": best.user_attrs.get("params_signature"),  # ...without the files' times: run.py's check
    }
    path = search.out / "best_params.json"
    storage.atomic_write(path, lambda t: Path(t).write_text(json.dumps(record, indent=1) + "\n"))
    return path


def summary_lines(study) -> list[str]:
    """The final table: trials, total and median duration per state (the field notes' SQL report)."""
    trials = study.get_trials(deepcopy=False)
    lines = [f"TUNE SUMMARY: {len(trials)} trials in study {study.study_name!r}", "state     trials  total_s  median_s"]
    for state in STATES:
        durations = [t.user_attrs.get("duration_s", 0.0) for t in trials if t.state.name == state]
        if durations:
            lines.append(f"{state:<9} {len(durations):>6} {sum(durations):>8.1f} {statistics.median(durations):>9.1f}")
    return lines


def save_plots(study, folder: Path) -> str:
    """optuna's optimisation history and parameter importances as PNG, when matplotlib is there."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as ov
    except ImportError as e:
        return f"PLOTS: skipped ({e.name} is not installed)"
    saved = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks its matplotlib plots experimental
        for name, plot in (("history", ov.plot_optimization_history), ("importance", ov.plot_param_importances)):
            try:
                ax = plot(study)
            except (ValueError, RuntimeError, ZeroDivisionError):  # importances need 2+ complete trials
                continue
            path = folder / f"{name}.png"
            storage.atomic_write(
                path, lambda t, fig=ax.figure: fig.savefig(t, format="png", dpi=100, bbox_inches="tight")
            )
            plt.close(ax.figure)
            saved.append(str(path))
    return f"PLOTS: {', '.join(saved)}" if saved else "PLOTS: none (too few finished trials)"


def report(study, search: Search) -> int:
    """After the trials: the table, the best line, best_params.json and the plots. Exit code:
    0 with a best_params.json, 1 without one (no trial reported a finite value)."""
    print(*summary_lines(study), sep="\n")
    path = write_best(study, search)
    best, value = best_trial(study)
    print(save_plots(study, search.folder))
    if path is None:
        print("TUNE FAILED: no trial reported a finite value; no best_params.json (the errors are above)")
        return 1
    kind = "" if best.state.name == "COMPLETE" else " (no trial completed: the best stopped one)"
    print(
        f"TUNE BEST: trial={best.number} {search.metric}={value:.5f} params={json.dumps(best.params, sort_keys=True)}{kind}"
    )
    # the data, signature and output flags the trials ran with: run.py reads best_params.json only from its
    # --out-dir and only when its run signature is the search's (other data or folds: PARAMS: ... left out)
    train = hardware.command("train.py", "--params", str(path), *search.next_flags)
    run = hardware.command("run.py", *search.next_flags)
    print(f"DONE: {path}; next: {train}  (or {run}, which reads it)")
    return 0
