"""The rules that change a run's plan while it trains, and the lines that say so.

The time planner (planner.py) holds where the run stands: the budget, the plan (folds, epochs),
the measures, and when to plan (the first estimate after a few timed steps, each epoch's end).
This module decides: the cut when the plan does not fit, the epochs and folds given back when
epochs run faster than the estimate that cut them, the deadline guard, and the TIME, TIME
ESTIMATE, TIME PLAN and DEADLINE lines (docs/log-format.md). The pure rules are functions, each
readable and testable alone; `Replanner` adds their memory (in which fold a cut or a give-back
last happened) and returns each change for the planner to apply: nothing here writes the
planner's fields. Pure Python, no torch; the numbers are in kagtpl's docs/time-budget.md. It is
machinery: `copier update` may replace it.
"""

from __future__ import annotations

from .durations import fmt_s
from .timings import Progress

PLAN_FRACTION, REPLAN_FRACTION = 0.80, 0.95  # an estimate gets 20% slack; measured epochs 5%
GIVE_BACK_FRACTION = 0.75  # epochs come back only with 25% slack: no cut / give-back see-saw
FIRST_FOLD_FRACTION = 0.20  # a first fold that took more of the budget re-plans at once


def cut_plan(at: Progress, epoch_s: float, folds: int, epochs: int, min_epochs: int, limit, first: bool):
    """The plan: cut folds to 3, then epochs (the first plan by 30%, then 50%; later ones no more
    than needed, never below `min_epochs`), then folds towards 1, giving back as many epochs as
    then fit; at the last fold, fit its epochs. `limit(folds)`: the seconds a plan of that many folds
    may use (fewer folds leave predict.py fewer checkpoints: more training time). Returns the new
    (folds, epochs)."""

    def fits(f, e):
        return at.need(epoch_s, f, e) <= limit(f)

    planned = epochs
    if not fits(folds, epochs) and folds > 3:
        folds = max(at.fold + 1, 3)
    if not fits(folds, epochs) and epochs > min_epochs:
        if first:
            for frac in (0.7, 0.5):
                if not fits(folds, epochs):
                    epochs = max(min_epochs, round(planned * frac))
        else:
            epochs = max(min_epochs, at.fit_epochs(epoch_s, folds, limit(folds), planned))
    if not fits(folds, epochs) and folds > at.fold + 1:
        while not fits(folds, epochs) and folds > at.fold + 1:
            folds -= 1  # towards 1 fold: keep as many as fit (each fold is a model in the ensemble)
        # fewer folds free time: give epochs back, up to the plan's, as many as fit
        epochs = max(epochs, at.fit_epochs(epoch_s, folds, limit(folds), planned))
    if not fits(folds, epochs):  # last resort: fit this fold's epochs
        epochs = min(epochs, at.fit_epochs(epoch_s, folds, limit(folds), planned))
    return folds, epochs


def give_back(at: Progress, epoch_s: float, folds: int, epochs: int, planned: int, limit: float) -> int | None:
    """Measured epochs faster than the estimate that cut them: the epochs to give back, as many
    as fit `limit` (75% of the time left: cuts start above 95%, no see-saw), never past the
    configured plan; None when no change is worth it (+20% at least)."""
    if at.need(epoch_s, folds, planned) <= at.need(epoch_s, folds, epochs):
        return None  # no epoch left in the plan that more epochs would add to (the last fold has ended)
    more = at.fit_epochs(epoch_s, folds, limit, planned)
    return more if more >= min(planned, epochs + max(2, epochs // 5)) else None


def folds_back(at: Progress, epoch_s: float, folds: int, epochs: int, planned: int, limit) -> int | None:
    """Measured epochs faster than the estimate that cut the folds: the most folds, up to the
    configured plan's, whose rest fits `limit(folds)` (each fold is a model of the ensemble and OOF
    rows of the CV, and one more checkpoint for predict.py); None when not one more fits."""
    return next((f for f in range(planned, folds, -1) if at.need(epoch_s, f, epochs) <= limit(f)), None)


def first_fold_overran(fold: int, took_s: float, budget_s: float) -> str | None:
    """Why to re-plan at once after the first fold: it took more than FIRST_FOLD_FRACTION of the budget."""
    if took_s <= FIRST_FOLD_FRACTION * budget_s:
        return None
    return f"fold {fold} took {fmt_s(took_s)} = {100 * took_s / budget_s:.0f}% of the budget (> 20%)"


def epoch_would_overrun(last_epoch_s: float, training_left: float) -> bool:
    """The deadline guard: an epoch as long as the last one would eat into predict.py's reserve."""
    return last_epoch_s > training_left


def room(p, fraction: float):
    """limit(folds): the seconds a plan of that many folds may use in planner `p`: `fraction` of its
    training time left, times this model's share of it (a table's models share the time)."""
    return lambda folds: fraction * p.training_left(folds) * p.share


class Replanner:
    """The re-plan rules over a planner's state: the first plan must fit 80% of the training time
    left, later re-plans use measured epochs and must fit 95% (cut_plan), or give epochs and then
    folds back (give_back, folds_back). Their memory is the hysteresis: the folds change at most
    once a fold, epochs come back at most once a fold and never after a cut in it (a loaded
    machine's epochs flipped a table's plan 5->3->5->3->4->5->3 in 60 s). Each method reads the
    planner (`p`) and returns the change, `(folds, epochs, line)`, or None; the planner applies it."""

    def __init__(self):
        self.folds_changed_in: int | None = None  # the fold in which a re-plan last changed the folds
        self.cut_in: int | None = None  # ...made a cut
        self.epochs_back_in: int | None = None  # ...gave epochs back
        self.said_too_small = False  # the too-small-budget line is said once

    def replan(self, p, epoch_s: float, why: str, first: bool = False):
        """The plan against `epoch_s`: kept (None), cut, or (measured, not the first) given back."""
        fraction = PLAN_FRACTION if first else REPLAN_FRACTION
        limit, at = room(p, fraction), p.times.progress(p.parallel)
        need = at.need(epoch_s, p.folds, p.epochs)
        if need <= limit(p.folds):
            return None if first else self.given_back(p, epoch_s)
        folds, epochs = cut_plan(at, epoch_s, p.folds, p.epochs, p.min_epochs, limit, first)
        fold = p.times.fold
        if folds != p.folds and not first and self.folds_changed_in == fold:
            # the folds changed in this fold already: only epochs are cut, the deadline guard holds
            folds = p.folds
            epochs = min(p.epochs, max(p.min_epochs, at.fit_epochs(epoch_s, folds, limit(folds), p.epochs)))
        cuts = [
            f"{name} {a}->{b}" for name, a, b in (("folds", p.folds, folds), ("epochs", p.epochs, epochs)) if a != b
        ]
        if not cuts:
            return None
        if not first:
            self.cut_in = fold
            self.folds_changed_in = fold if folds != p.folds else self.folds_changed_in
        label = f"estimate {fmt_s(need)}" if first else f"{why}: need {fmt_s(need)}"
        return folds, epochs, cut_line(label, fraction, p.training_left() * p.share, p.share, cuts)

    def given_back(self, p, epoch_s: float):
        """Measured epochs faster than the estimate that cut the plan: epochs back first, up to the
        configured plan, then folds (each fold is a model of the ensemble and OOF rows of the CV),
        as many as fit 75% of the time left. Fold workers share the fold count: not there."""
        fold = p.times.fold
        if len(p.times.epoch_s) < 2 or self.cut_in == fold:  # measured: an epoch after the first; none after a
            return None  # cut in this fold (a loaded machine gave back and cut 6 times in one fold)
        limit, at = room(p, GIVE_BACK_FRACTION), p.times.progress(p.parallel)
        left = f"measured {fmt_s(epoch_s)}/epoch: the rest fits in {fmt_s(max(0.0, p.training_left()))} left"
        if p.epochs < p.planned_epochs and self.epochs_back_in != fold:
            epochs = give_back(at, epoch_s, p.folds, p.epochs, p.planned_epochs, limit(p.folds))
            if epochs is None:
                return None
            self.epochs_back_in = fold
            return p.folds, epochs, f"TIME PLAN: {left} -> epochs {p.epochs}->{epochs} (given back)"
        if p.folds >= p.planned_folds or p.parallel > 1 or self.folds_changed_in == fold:
            return None
        folds = folds_back(at, epoch_s, p.folds, p.epochs, p.planned_folds, limit)
        if folds is None:
            return None
        self.folds_changed_in = fold
        return folds, p.epochs, f"TIME PLAN: {left} -> folds {p.folds}->{folds} (given back)"

    def too_small(self, p, why: str, epoch_s: float | None = None) -> str | None:
        """The line of a budget that fits no epoch, once (at the first estimate, or at a deadline that
        came before one): the submission is train.py's fallback or a checkpoint from inside the first
        epoch. What fits one epoch: the time so far, the epoch with the estimate's slack, the rest."""
        if self.said_too_small:
            return None
        self.said_too_small = True
        need = None
        if epoch_s is not None:
            need = p.budget - p.training_left() + epoch_s / PLAN_FRACTION  # spent and kept back, then the epoch
        return too_small_line(p.budget, why, need)


# ----------------------------------------------------------------------------- the lines
def too_small_line(budget_s: float, why: str, fits_one_s: float | None) -> str:
    """The TIME PLAN line of a budget that fits no epoch, and the budget that would fit one."""
    enough = f"; a budget of at least {fmt_s(fits_one_s)} fits one" if fits_one_s is not None else ""
    return (
        f"TIME PLAN: the budget {fmt_s(budget_s)} is too small for one epoch ({why}): the submission will be "
        f"train.py's fallback or a checkpoint from inside the first epoch{enough}"
    )


def no_training_line(p) -> str:
    """Tables: the TIME PLAN line of a budget whose start, finish and prediction reserve left no time
    before the first model, and the budget above which the same start leaves some."""
    spent = p.budget - p.training_left() - p.reserve()  # the time so far and the run's finish
    need = p.prediction.budget_leaving(spent, p.folds)
    return (
        f"TIME PLAN: the budget {fmt_s(p.budget)} leaves no time to train ({fmt_s(p.elapsed())} spent before the "
        f"first model, {fmt_s(spent - p.elapsed())} for the end, {fmt_s(p.reserve())} kept for predict.py): the "
        f"submission will be train.py's fallback; a budget above {fmt_s(need)} leaves time to train"
    )


def time_line(elapsed_s: float, budget_s: float, reserve_s: float, folds: int, epochs: int, epoch_s=None) -> str:
    """The TIME line: where the run stands against its budget, and the plan."""
    plan = f"plan folds={folds} epochs={epochs}"
    if not budget_s:
        return f"TIME: elapsed {fmt_s(elapsed_s)}, no budget, {plan}"
    last = f", epoch ~{fmt_s(epoch_s)}" if epoch_s is not None else ""
    return (
        f"TIME: elapsed {fmt_s(elapsed_s)} of {fmt_s(budget_s)} budget, remaining "
        f"{fmt_s(budget_s - elapsed_s)} (reserve {fmt_s(reserve_s)} for predict), {plan}{last}"
    )


def deadline_line(elapsed_s: float, epoch_s: float, reserve_s: float, finish_s: float, budget_s: float) -> str:
    """The DEADLINE line: the next epoch would eat into predict.py's reserve."""
    return (
        f"DEADLINE: elapsed {fmt_s(elapsed_s)} + next epoch ~{fmt_s(epoch_s)} + reserve {fmt_s(reserve_s)} + "
        f"finish {fmt_s(finish_s)} > budget {fmt_s(budget_s)}: stopping, prediction runs next"
    )


def estimate_line(how: str, epoch_s: float, epochs: int, folds: int, training_s: float, reserve_s: float) -> str:
    """The TIME ESTIMATE line: the whole plan at the first timed steps' rate, against the training budget."""
    return (
        f"TIME ESTIMATE: {how} = {fmt_s(epoch_s)}/epoch x {epochs} epochs x {folds} folds = "
        f"{fmt_s(epoch_s * epochs * folds)} for the whole plan; training budget {fmt_s(training_s)} "
        f"(reserve {fmt_s(reserve_s)} for predict)"
    )


def cut_line(label: str, fraction: float, left_s: float, share: float, cuts: list[str]) -> str:
    """The TIME PLAN line of a cut: what the plan needs against the share of the time left it may use."""
    mine = f" (this model's share: 1/{round(1 / share)})" if share < 1 else ""
    return f"TIME PLAN: {label} > {fraction:.0%} of {fmt_s(max(0.0, left_s))} training time left{mine} -> {', '.join(cuts)}"
