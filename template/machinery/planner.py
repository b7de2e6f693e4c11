"""The time planner: fits folds and epochs to a wall-time budget and guards the deadline.

Pure Python, no torch: kagtpl's generator imports this same file for `kagtpl recommend`
(the reserve and the training share it shows are these constants), and the engine drives it
during training. The rules and their numbers are in kagtpl's docs/time-budget.md.
It is machinery: `copier update` may replace it, so keep your own code elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from . import hardware
from .durations import fmt_s, parse_duration, process_age
from .errors import RunError
from .replanning import Replanner, deadline_line, epoch_would_overrun, estimate_line, first_fold_overran, time_line
from .reserve import READY_ENV, PredictionReserve, PredictStart
from .tasks import TASKS
from .timings import Timings

PROCESS_START = time.time()  # wall clock at import: the budget counts from here unless told otherwise
KAGGLE_BUDGET = "9h"  # Kaggle code competitions: 9 hours of wall time, internet off
DEFAULT_PLAN = {task.name: (task.folds, task.epochs) for task in TASKS}  # folds, epochs: the registry's (tasks.py)
# run.py's safety net: SIGTERM to a train.py still running at this share of the budget. It must come
# after the planner's own end of training (1 - reserve.py's MEASURED_FRACTION at the latest, less
# FINISH_S): at 85%, equal to the end of that time, a healthy run was killed while its
# interpreter exited. 95% leaves 3% of the budget and 5 s after it.
SAFETY_NET = 0.95
# After the last epoch train.py still scores the OOF predictions, draws the report and exits;
# the interpreter's exit alone (torch, timm) took 1-2 s of the 3 s measured on 2 CPU cores.
FINISH_S = 5.0


def make_planner(
    budget: str, start_time: float, folds: int, epochs: int, sync=None, beside=False, fixed_reserve=None, parallel=1
) -> TimePlanner:
    """The run's planner: --budget parsed (on Kaggle with none, 9h), SIGTERM handled.
    `sync` is torch.cuda.synchronize on CUDA, so the timed steps are real. `beside`: run.py started
    predict.py beside train.py, so its interpreter start and imports are paid while train.py
    trains: once predict.py says they are (reserve.PredictStart), the reserve counts only what
    train.py did after its own imports (the device, the data). On an H100 the whole start had kept
    14-27 s of a 60 s budget for a predict.py that took 7-11 s.
    `parallel`: the fold workers sharing the folds (--parallel folds), 1 otherwise."""
    try:
        seconds = parse_duration(budget)
    except ValueError as e:
        raise RunError(f"--budget: {e}") from None
    if seconds is None and hardware.on_kaggle():
        seconds = parse_duration(KAGGLE_BUDGET)
        print(f"TIME: on Kaggle with no --budget: using {KAGGLE_BUDGET}, the code-competition limit")
    # PROCESS_START is this module's import, near the end of train.py's imports (torch, the task's
    # libraries, then machinery): beside, predict.py's start less its imports, once it says it paid them
    after_imports = time.time() - PROCESS_START if beside else None
    start = PredictStart(process_age(), after_imports, os.environ.get(READY_ENV, ""))
    elapsed_s = time.time() - start_time
    # fixed_reserve: --predict-reserve's seconds instead of the rule
    prediction = PredictionReserve(seconds, start, fixed_reserve)
    planner = TimePlanner(seconds, folds, epochs, elapsed_s=elapsed_s, prediction=prediction, sync=sync)
    planner.parallel = parallel
    install_stop_signals(planner.request_stop)
    return planner


EARLY_STOPS: list[str] = []  # a SIGTERM that came before the planner existed (keep_early_stops): handed to it
# The terminal closed (an SSH connection dropped, a terminal window shut): the kernel or the shell
# sends SIGHUP, whose default ended the run where it stood; it is a stop like SIGTERM. Not under
# `nohup` (SIGHUP ignored, as it asks: the run goes on to its end).
HANGUP = "SIGHUP (the terminal closed)"
SIGNALLED = ("SIGTERM", HANGUP)  # stops sent to the run from outside: its fold workers are told (SIGTERM)


def under_nohup() -> bool:
    """SIGHUP is ignored (nohup, inherited through exec): a hangup is no stop, and the run goes on."""
    return signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def keep_early_stops() -> None:
    """A run's first step (runflags.begin): a SIGTERM from here until the planner exists is kept
    for it, not fatal, so the run still reaches its preflight's fallback submission and then ends
    like any stop. run.py starts train.py with SIGTERM blocked: one sent while train.py imports
    (its first 3-4 s; a container's stop, or run.py's death) waited, and arrives here. Not when a
    caller took SIGTERM (tune.py, between its trials)."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: EARLY_STOPS.append("SIGTERM"))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def install_stop_signals(request_stop) -> None:
    """SIGTERM (a container's stop) and SIGHUP (the terminal closed: HANGUP) end training like the
    deadline: save, then exit 0; a SIGTERM that came before (keep_early_stops) is asked now.
    Ctrl-C (SIGINT) too, once: the run saves and says so instead of a 40-line traceback; a second
    Ctrl-C interrupts at once (errors.main turns it into one line)."""
    signal.signal(signal.SIGTERM, lambda *_: request_stop("SIGTERM"))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # a script that skipped keep_early_stops
    if not under_nohup():  # tune.py's handler between trials is taken over, as SIGTERM's is
        signal.signal(signal.SIGHUP, lambda *_: request_stop(HANGUP))
    if EARLY_STOPS:
        request_stop(EARLY_STOPS.pop())
        EARLY_STOPS.clear()

    def on_sigint(*_) -> None:
        # the stop first: it must not depend on the line below, a write to a pipe that may be full or gone
        request_stop("SIGINT (Ctrl-C)")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(OSError):
            print("STOPPING: Ctrl-C: saving and ending after this step (Ctrl-C again to interrupt now)", flush=True)

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when a caller (tune.py) took it
        signal.signal(signal.SIGINT, on_sigint)


class TimePlanner:
    """Fits folds and epochs to a wall-time budget and guards the deadline, so prediction always gets
    its reserve: the plan, the measures (`times`, timings.py), predict.py's reserve (`prediction`,
    reserve.py) and the hooks the training loop calls. What changes the plan is replanning.py's rules
    (docs/time-budget.md). Seams for tests: `clock` (monotonic seconds; a fake one drives every
    decision) and `sync` (torch.cuda.synchronize on CUDA, so the timed steps are real)."""

    def __init__(
        self, budget_s, folds, epochs, min_epochs=3, elapsed_s=0.0, prediction=None, clock=None, sync=None, log=print
    ):
        self.budget, self.folds, self.epochs = budget_s, folds, epochs
        self.planned_folds, self.planned_epochs = folds, epochs  # the configured plan: a give-back stops there
        self.min_epochs = min(min_epochs, epochs)
        self.clock, self.sync, self.log = clock or time.monotonic, sync or (lambda: None), log
        self.t0 = self.clock() - elapsed_s
        # what predict.py keeps of the budget (reserve.py), made by make_planner from the run's start
        self.prediction = prediction or PredictionReserve(budget_s)
        self.times = Timings(self.clock)  # what the run measured, fold by fold (growth reads it too)
        self.stop_reason: str | None = None
        self.planned = False  # the first estimate (after warm-up) has been made
        self.parallel = 1  # fold workers sharing the folds (--parallel folds); DDP ranks share each fold
        self.share = 1.0  # of the training time left, what this model's plan may use (tables: 1 / models left)
        self.plan_changed = False  # since the last TIME line: the next epoch prints one
        self.rules = Replanner()  # the re-plan rules' memory: in which fold a cut or give-back last happened
        self.growing = False  # growth's folds from here on (fold_back, grown_fold): no re-plan

    # --- where we stand
    def elapsed(self) -> float:
        return self.clock() - self.t0

    def reserve(self) -> float:
        """predict.py's share of what is left: the plan's folds as they stand (cut or given back)."""
        return self.prediction.seconds(self.folds)

    def training_time(self, folds: int | None = None) -> float:
        """The budget's time for training, from the run's start: the budget less the finish (with
        the grown seeds' judging pass) and predict.py's reserve for `folds` (default: the plan's)."""
        return self.budget - self.prediction.reserved_s(self.folds if folds is None else folds) - FINISH_S

    def training_left(self, folds: int | None = None) -> float:
        """training_time less the time spent. A cut prices each candidate plan with its own reserve:
        pricing 1 fold with 3 folds' reserve left a detection fold 1 epoch of the 6 that fit, on an H200."""
        return self.training_time(folds) - self.elapsed()

    def status_line(self) -> str:
        """The TIME line: after each fold and after an epoch that changed the plan (18 said nothing new)."""
        self.plan_changed = False
        return time_line(self.elapsed(), self.budget, self.reserve(), self.folds, self.epochs, self.times.last_epoch_s)

    # --- signals (install_stop_signals: SIGTERM and Ctrl-C end training like the deadline)
    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    # --- what others change, each by a method (no module writes the planner's fields)
    def agreed(self, folds: int, epochs: int | None = None) -> None:
        """Other processes' cut, taken: DDP's vote (parallel.agree_plan) or the fold workers' (FoldQueue.cap)."""
        self.folds, self.epochs = folds, self.epochs if epochs is None else epochs

    def split_among(self, models: int) -> None:
        """A table's models train one after another: this one's plan may use 1/models of the time left."""
        self.share = 1 / models

    def fold_back(self, fold: int) -> None:
        """A fold of the split a cut plan left out, trained now: predict.py ensembles it (the reserve counts it).
        Growth's folds (this and grown_fold) never re-plan: each was checked to fit before it started."""
        self.folds, self.growing = fold + 1, True

    @contextlib.contextmanager
    def grown_fold(self, epochs: int):
        """A grown seed's fold trains `epochs` (growth's target, or fewer to fit); the plan's stand after it."""
        planned, self.epochs, self.growing = self.epochs, epochs, True
        try:
            yield
        finally:
            self.epochs = planned

    # --- hooks the training loop calls (the measures: self.times)
    def tick(self, batch: int) -> bool:
        """After each training batch: time the first steps after warm-up (the first estimate)
        and say whether to stop now (deadline passed or SIGTERM)."""
        if self.budget and not self.planned and not self.growing:  # a grown fold never re-plans the folds
            s_per_step = self.times.first_steps(batch, self.sync)
            if s_per_step is not None:
                self._first_plan(s_per_step)
        if self.budget and self.training_left() <= 0:
            self.request_stop("deadline")
            if not self.planned and not self.times.epoch_s:
                self.too_small(f"the deadline came at step {batch + 1} of the first, before any estimate")
        return self.stop_reason is not None

    def end_epoch(self, epoch: int) -> None:
        self.times.end_epoch(epoch)
        if self.budget and not self.planned and not self.growing:  # too few batches to time steps: plan from the epoch
            self._first_plan(None)
        elif self.budget and not self.growing:
            self._replan(self.times.estimate(), f"re-plan at {fmt_s(self.times.estimate())}/epoch")

    def end_fold(self, fold: int, first: bool, curve: list[float] | None = None) -> None:
        took = self.times.end_fold(self.epochs, curve)  # a fold of the split's `curve`: growth's evidence
        why = self.budget and first and first_fold_overran(fold, took, self.budget)
        if why and not self._replan(max(self.times.estimate(), took / max(1, self.times.epoch)), why):
            self.log(f"TIME PLAN: {why} -> plan kept: folds={self.folds} epochs={self.epochs}")

    def resumed_fold(self, timing) -> None:
        """A planned fold skipped as complete (resume): its checkpoint's timing (Timings.fold_timing) stands
        for this process's measure. Without one (an older checkpoint) growth waits for a fold this process
        trains (it had grown with TTA views priced at 0 s and a reserve for 1 checkpoint, predict.py ensembling 4)."""
        if self.times.resumed(timing):
            self.prediction.resumed(float(timing.get("predict_fold_s") or 0))

    def can_start_epoch(self) -> bool:
        """Deadline guard: no epoch starts that would eat into the prediction reserve."""
        if self.stop_reason:
            return False
        last = self.times.last_epoch_s
        if self.budget and last is not None and epoch_would_overrun(last, self.training_left()):
            self.request_stop("deadline")
            finish = FINISH_S + self.prediction.judging_s(self.folds)  # the grown seeds' judging pass too
            self.log(deadline_line(self.elapsed(), last, self.reserve(), finish, self.budget))
            return False
        return True

    # --- planning (the rules: replanning.py)
    def _first_plan(self, s_per_step: float | None) -> None:
        self.planned = self.plan_changed = True
        epoch_s, how = self.times.first_estimate(s_per_step)
        self.log(estimate_line(how, epoch_s, self.epochs, self.folds, self.training_time(), self.reserve()))
        if not self._replan(epoch_s, "estimate", first=True):
            self.log(f"TIME PLAN: fits, kept folds={self.folds} epochs={self.epochs}")
        if epoch_s > self.training_left() * self.share:
            self.too_small(
                f"~{fmt_s(epoch_s)}/epoch, {fmt_s(max(0.0, self.training_left()))} training time left", epoch_s
            )

    def too_small(self, why: str, epoch_s: float | None = None) -> None:
        """Said once: no epoch fits the budget (replanning.Replanner.too_small)."""
        if line := self.rules.too_small(self, why, epoch_s):
            self.log(line)

    def _replan(self, epoch_s: float, why: str, first: bool = False) -> bool:
        """The rules' change to the plan (replanning.Replanner.replan), applied and said. Returns
        whether the plan changed."""
        change = self.rules.replan(self, epoch_s, why, first)
        if change is None:
            return False
        self.folds, self.epochs, line = change
        self.plan_changed = True
        self.log(line)
        return True
