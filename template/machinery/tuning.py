"""Hyper-parameter search with optuna inside the time budget: the machinery behind tune.py.

tune.py holds the search space, a function you edit. This module runs it:
- the study, in its storage (study_storage.py): a journal file in output/tune/ by default, safe
  for several processes; --storage takes an optuna RDB URL (PostgreSQL or MySQL for several machines);
- the pruner: PatientPruner(HyperbandPruner(min_resource=3, reduction_factor=3), patience=4),
  or a MedianPruner when the search is too small for Hyperband's brackets (the rule is printed);
- the trials: each is train.py's own main() on the first --tune-folds folds, in this process,
  its epochs reported to optuna through engine.watching; between trials the model, optimizer
  and CUDA cache are freed, and a failed trial is recorded FAILED with its error;
- the budget: no trial starts that would not fit, and a running one stops at the deadline;
- --workers K: K processes share the study (and the GPU, each within its share of memory);
- the results: a TUNE: line per trial, output/best_params.json after every trial that beats
  the best (train.py --params reads it), a final table of states and durations, optuna's plots.
The line formats are in kagtpl's docs/log-format.md, the rules in docs/tuning.md. It is
machinery: `copier update` may replace it, so keep your own code in tune.py and train.py.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import signal
import socket
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

from . import engine, storage, workers
from . import planner as time_planner
from .errors import RunError
from .gpu import free_gpu_memory
from .study_storage import describe_storage, open_storage
from .tuning_report import report, write_best

HYPERBAND = {"min_resource": 3, "reduction_factor": 3}  # the field notes' pruner, epochs as the resource
PATIENCE = 4  # ...wrapped in PatientPruner: no trial is cut while it still improved in its last 4 epochs
TPE_STARTUP = 10  # TPESampler's random trials before it models: Hyperband needs that many per bracket
FINISH_S = 10.0  # after the last trial: the table, best_params.json and the plots
GIVE_UP_AFTER = 3  # this many failed trials and none complete: the space or the data is broken
GIVE_UP_IN_A_ROW = 10  # ...or this many in a row after some completed: something broke mid-search


@dataclass
class Search:
    """One tune.py run's settings: the one home of each, read by every step below."""

    out: Path  # output/: best_params.json; the journal, the trials' folders and the plots in out/tune
    study_name: str
    storage_url: str  # "" = the journal file out/tune/optuna.journal
    trials: int  # finished trials (complete or pruned) the study stops at, over every worker and run
    budget_s: float | None
    start: float  # wall clock the budget counts from
    folds: int  # folds each trial trains (train.py --train-folds)
    epochs: int  # train.py's --epochs: with folds, the steps the pruner sees
    direction: str  # "maximize" or "minimize": the metric train.py's epoch lines print
    metric: str
    pruner: str  # auto, hyperband, median or none
    seed: int
    workers: int
    gpus: int  # GPUs the workers spread over (0: the trials train on the CPU)
    train_argv: list[str]  # the train.py flags every trial gets
    next_flags: tuple[str, ...] = ()  # what train.py and run.py repeat to use best_params.json (the DONE line)

    @property
    def folder(self) -> Path:
        return self.out / "tune"

    @property
    def steps(self) -> int:
        return self.folds * self.epochs

    def left(self) -> float:
        """Seconds of the budget left for trials (inf without a budget)."""
        if not self.budget_s:
            return math.inf
        return self.budget_s - (time.time() - self.start) - FINISH_S


# ----------------------------------------------------------------------------- storage, pruner, study


def hyperband_brackets(steps: int) -> int:
    """optuna's HyperbandPruner bracket count for max_resource = steps: floor(log_3(steps / 3)) + 1."""
    ratio = steps / HYPERBAND["min_resource"]
    return 1 + int(math.floor(math.log(ratio, HYPERBAND["reduction_factor"]) + 1e-9)) if ratio >= 1 else 0


def choose_pruner(search: Search):
    """(pruner, the PRUNER: line). Hyperband when each trial has at least 9 steps (two brackets:
    anything less is one rung of successive halving) and the search has TPE_STARTUP trials per
    bracket; else a MedianPruner, which needs only a few finished trials to compare with."""
    import optuna

    steps, brackets = search.steps, hyperband_brackets(search.steps)
    need = TPE_STARTUP * max(brackets, 2)
    rule = (
        f"Hyperband needs >= {HYPERBAND['min_resource'] * HYPERBAND['reduction_factor']} epochs per trial and "
        f">= {TPE_STARTUP} trials per bracket; this search: {steps} epoch(s) per trial ({brackets} bracket(s)), "
        f"{search.trials} trials, {need} needed"
    )
    fits = steps >= HYPERBAND["min_resource"] * HYPERBAND["reduction_factor"] and search.trials >= need
    name = search.pruner if search.pruner != "auto" else ("hyperband" if fits else "median")
    if name == "none":
        return optuna.pruners.NopPruner(), "PRUNER: none (--pruner none): every trial runs to its end"
    if name == "hyperband":
        inner = optuna.pruners.HyperbandPruner(max_resource=steps, **HYPERBAND)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # PatientPruner, since 2.8
            pruner = optuna.pruners.PatientPruner(inner, patience=PATIENCE)
        return pruner, (
            f"PRUNER: PatientPruner(HyperbandPruner(min_resource=3, max_resource={steps}, reduction_factor=3), "
            f"patience={PATIENCE}) ({'--pruner hyperband' if search.pruner != 'auto' else rule})"
        )
    startup = max(1, min(5, search.trials // 4))
    pruner = optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=2)
    return pruner, (
        f"PRUNER: MedianPruner(n_startup_trials={startup}, n_warmup_steps=2): a trial whose best epoch so far is "
        f"worse than the median of finished trials at that epoch stops ({'--pruner median' if search.pruner != 'auto' else rule})"
    )


def open_study(search: Search, storage_obj, worker: int = 0):
    """Create the study, or load it (a killed search resumes where it was). TPE's seed is fixed,
    offset by the worker's index: K workers with one seed would try the same parameters."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our TUNE: lines say what optuna's INFO would
    pruner, _ = choose_pruner(search)
    sampler = optuna.samplers.TPESampler(seed=search.seed + worker)
    study = optuna.create_study(
        study_name=search.study_name,
        storage=storage_obj,
        sampler=sampler,
        pruner=pruner,
        direction=search.direction,
        load_if_exists=True,
    )
    if study.direction.name.lower() != search.direction:
        raise RunError(
            f"study {search.study_name!r} {study.direction.name.lower()}s, this search would {search.direction} "
            f"{search.metric}: give another --study name"
        )
    return study


def fail_stale_trials(study, storage_obj) -> list[int]:
    """Trials left RUNNING by a killed tune.py on this machine (their pid is gone) become FAILED,
    so the study counts them out; other machines' running trials are left alone. Each worker
    looks before its next trial (one killed by the OOM killer left its trial RUNNING, counted
    toward --trials for good); two that find the same trial: the first fails it."""
    import optuna

    host, stale = socket.gethostname(), []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        pid = t.user_attrs.get("pid")
        if t.user_attrs.get("host") == host and pid and pid != os.getpid() and not storage.pid_alive(pid):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                storage_obj.set_trial_user_attr(t._trial_id, "error", "its tune.py was killed")
                storage_obj.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
                stale.append(t.number)
    return stale


def said_stale(stale: list[int]) -> None:
    if stale:
        print(f"TUNE STALE: trial(s) {stale} RUNNING -> FAILED: their tune.py was killed (its pid is gone)", flush=True)


# ----------------------------------------------------------------------------- one trial


class TrialWatcher:
    """engine.watching's watcher for one optuna trial: reports the metric after every epoch
    (step = fold position x epochs + epoch), asks the pruner, and keeps each fold's metric at
    its best val loss (the checkpoint train.py keeps): the trial's value is their mean."""

    def __init__(self, trial, epochs: int):
        self.trial, self.epochs = trial, epochs
        self.best: dict[int, tuple[float, float]] = {}  # fold -> (val loss, metric)
        self.folds: list[int] = []
        self.stop: str | None = None
        self.last_step = 0

    def epoch(self, fold: int, epoch: int, val_loss: float, metric: float) -> str | None:
        if fold not in self.folds:
            self.folds.append(fold)
        self.last_step = self.folds.index(fold) * self.epochs + epoch
        self.trial.report(float(metric), self.last_step)
        if math.isfinite(val_loss) and math.isfinite(metric) and val_loss < self.best.get(fold, (math.inf,))[0]:
            self.best[fold] = (val_loss, metric)
        if self.trial.should_prune():
            self.stop = "pruned"
            return "pruned"
        return None

    def started(self, signature: str, params_signature: str) -> None:
        """The trial's run signature, and the one without the files' times that run.py --params auto
        checks (artifacts.params_signature): best_params.json carries both."""
        self.trial.set_user_attr("signature", signature)
        self.trial.set_user_attr("params_signature", params_signature)

    def stopped(self, reason: str | None) -> None:
        self.stop = self.stop or reason

    @property
    def value(self) -> float | None:
        return statistics.fmean(m for _, m in self.best.values()) if self.best else None


def trial_argv(search: Search, folder: Path, params_file: Path) -> list[str]:
    """train.py's flags for one trial: the user's, then the trial's (which win: argparse keeps the last)."""
    # the search's deadline, less the time its report takes after the last trial
    budget = (
        [f"--budget={max(1.0, search.budget_s - FINISH_S)}", f"--start-time={search.start}"] if search.budget_s else []
    )
    return [
        *search.train_argv,
        f"--out-dir={folder}",
        f"--params={params_file}",
        f"--train-folds={search.folds}",
        "--parallel=none",  # a trial is one process; several run side by side with --workers
        "--predict-reserve=0",  # a trial never predicts: its deadline is the search's
        *budget,
    ]


def trial_folder(search: Search, number: int) -> Path:
    """output/tune/trial_NNNN, its cache/ linked to output/cache: the decoded images and the
    tokens are made once (by train.py or the first trial) and every trial reads them."""
    folder = search.folder / f"trial_{number:04d}"
    folder.mkdir(parents=True, exist_ok=True)
    shared = search.out / "cache"
    shared.mkdir(parents=True, exist_ok=True)
    if not (folder / "cache").exists():
        (folder / "cache").symlink_to(shared.resolve(), target_is_directory=True)
    return folder


def free_trial_memory(folder: Path) -> None:
    """Between trials: the trial's model, optimizer and batches are garbage once its main() has
    returned; collect them now and give the CUDA cache back, and delete its checkpoints (train.py
    retrains with the best parameters; 100 trials of a 300 MB model would fill the disk)."""
    gc.collect()
    free_gpu_memory()
    for f in folder.glob("*.pth"):
        f.unlink(missing_ok=True)


def run_trial(study, search: Search, space, train_main) -> tuple[str, str | None]:
    """Ask for a trial, run train.py's main() on it, tell optuna how it ended; print its TUNE: line.
    Returns its state and what stopped it (pruned, deadline, SIGTERM or None)."""
    import optuna

    trial, t0 = study.ask(), time.time()
    trial.set_user_attr("host", socket.gethostname())  # fail_stale_trials finds a killed run's trials by these
    trial.set_user_attr("pid", os.getpid())
    folder = trial_folder(search, trial.number)
    watcher, error, params = TrialWatcher(trial, search.epochs), None, {}
    with open(folder / "train.log", "w", buffering=1) as log:  # line by line: `tail -f` follows a trial
        try:
            params = space(trial)
            trial.set_user_attr("flags", params)  # what train.py got; best_params.json repeats it
            params_file = folder / "params.json"
            storage.atomic_write(params_file, lambda t: Path(t).write_text(json.dumps({"params": params}, indent=1)))
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), engine.watching(watcher):
                train_main(trial_argv(search, folder, params_file))
        except RunError as e:
            error = f"{e.prefix}: {e}"
        except (Exception, SystemExit) as e:  # any failure of the user's code: the trial FAILED, the study goes on
            error = f"{type(e).__name__}: {e}"
            log.write(traceback.format_exc())
        if error:
            log.write(f"TRIAL FAILED: {error}\n")
            error = " ".join(error.split())  # one line in the TUNE: line; the whole of it is in the log
    free_trial_memory(folder)
    state, value = outcome(watcher, error)
    trial.set_user_attr("duration_s", round(time.time() - t0, 2))
    if error:
        trial.set_user_attr("error", error[:500])
    if watcher.stop and watcher.stop != "pruned":
        trial.set_user_attr("stopped", watcher.stop)
    study.tell(trial, value if state == "COMPLETE" else None, state=getattr(optuna.trial.TrialState, state))
    print(tune_line(trial.number, state, value, watcher.last_step, time.time() - t0, params, error or watcher.stop))
    sys.stdout.flush()
    return state, watcher.stop


def outcome(watcher: TrialWatcher, error: str | None) -> tuple[str, float | None]:
    """FAIL on an error or with no finite metric; PRUNED when the pruner, the deadline or SIGTERM
    stopped it (value: its last report); else COMPLETE with the mean of its folds' best metrics."""
    if error:
        return "FAIL", None
    if watcher.stop:
        return "PRUNED", watcher.value
    if watcher.value is None:
        return "FAIL", None
    return "COMPLETE", watcher.value


def tune_line(number: int, state: str, value, steps: int, seconds: float, params: dict, why: str | None) -> str:
    shown = "none" if value is None else f"{value:.5f}"
    line = (
        f"TUNE: trial={number} state={state} value={shown} steps={steps} duration={seconds:.1f}s "
        f"params={json.dumps(params, sort_keys=True)}"
    )
    if state == "FAIL":
        return f"{line} error={why or 'no finite validation metric'}"
    return f"{line} reason={why}" if state == "PRUNED" and why else line


# ----------------------------------------------------------------------------- the loop, the budget


def why_stop(study, search: Search, stop: dict, failures: int, in_a_row: int) -> str | None:
    """None to start another trial; else why not: the trial count, SIGTERM or SIGHUP, the budget (the
    median complete trial's duration must fit in what is left), or repeated failures (failed
    trials do not count toward --trials: without this rule a search whose every new trial fails
    would never end)."""
    import optuna

    if stop.get("signal"):
        return f"{stop['signal']}: no new trial (the running one saved what it had)"
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
    trials = study.get_trials(deepcopy=False, states=states)
    if len(trials) >= search.trials:
        return f"{search.trials} trials reached (finished or running)"
    if failures >= GIVE_UP_AFTER and not any(t.state == optuna.trial.TrialState.COMPLETE for t in trials):
        return f"{failures} trials failed and none completed: see the errors above"
    if in_a_row >= GIVE_UP_IN_A_ROW:
        return f"{in_a_row} trials in a row failed: see the errors above"
    left = search.left()
    if left <= 0 or stop.get("deadline"):  # a trial's train.py met the deadline (theirs is the search's)
        return "the budget is spent"
    done = [t.user_attrs["duration_s"] for t in trials if t.state.name == "COMPLETE" and "duration_s" in t.user_attrs]
    if done and statistics.median(done) > left:
        need = time_planner.fmt_s(statistics.median(done))
        return f"the next trial would not fit: a complete one takes ~{need}, {time_planner.fmt_s(left)} left"
    return None


def work(study, storage_obj, search: Search, space, train_main) -> int:
    """One process's trials, until why_stop says no more. Returns how many failed. `storage_obj`:
    the study's storage (open_storage), where a killed worker's trial is counted out."""
    stop = {}

    def on_signal(signum, _frame):
        stop["signal"] = time_planner.HANGUP if signum == signal.SIGHUP else "SIGTERM"

    failures = in_a_row = 0
    hangup = not time_planner.under_nohup()  # under nohup the search goes on
    while True:
        signal.signal(signal.SIGTERM, on_signal)  # each trial's planner takes SIGTERM; it is ours between them
        if hangup:  # and SIGHUP (the terminal closed), as the planner's
            signal.signal(signal.SIGHUP, on_signal)
        said_stale(fail_stale_trials(study, storage_obj))  # a worker killed mid-trial: its trial counts out
        if reason := why_stop(study, search, stop, failures, in_a_row):
            print(f"TUNE STOP: {reason}", flush=True)
            break
        state, stopped_by = run_trial(study, search, space, train_main)
        failures += state == "FAIL"
        in_a_row = in_a_row + 1 if state == "FAIL" else 0
        if stopped_by in time_planner.SIGNALLED:
            stop["signal"] = stopped_by
        elif stopped_by == "deadline":
            stop["deadline"] = True
        write_best(study, search)
    return failures


def main(search: Search, space, train_main, workers_why: str) -> int:
    """tune.py's main: a worker runs its trials; the first tune.py prints the plan, fails stale
    trials, runs the trials itself (one worker) or starts the workers, then reports."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise RunError("tune.py needs optuna: pip install optuna (Kaggle's images have it)") from None
    worker, storage_obj = workers.this_tune_worker(), open_storage(search.storage_url, search.folder)
    if worker:
        work(open_study(search, storage_obj, worker[0]), storage_obj, search, space, train_main)
        return 0
    study = open_study(search, storage_obj)  # made once here: K workers creating it at once would race
    stale = fail_stale_trials(study, storage_obj)
    budget = time_planner.fmt_s(search.budget_s) if search.budget_s else "none"
    where = describe_storage(search.storage_url, search.folder)
    print(
        f"TUNE START: study={search.study_name} storage={where} direction={search.direction} "
        f"metric={search.metric} trials={search.trials} budget={budget} workers={search.workers} "
        f"folds/trial={search.folds} epochs/fold={search.epochs}"
    )
    print(f"WORKERS: {search.workers} ({workers_why})")
    print(choose_pruner(search)[1])
    if done := len(study.trials):
        print(
            f"TUNE RESUME: {done} trial(s) already in the study"
            + (f"; stale RUNNING -> FAILED: {stale}" if stale else "")
        )
    if search.workers == 1:
        work(study, storage_obj, search, space, train_main)
    else:
        codes = workers.run_tune_workers(search.workers, search.gpus, search.start)
        if any(codes):
            print(f"WARNING: tune workers exited {codes}; their finished trials are in the study")
        said_stale(fail_stale_trials(study, storage_obj))  # the last worker's: none left to see it
    return report(study, search)  # the study reads the storage anew: the workers' trials are in it
