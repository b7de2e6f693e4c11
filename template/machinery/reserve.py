"""The prediction reserve: the time train.py leaves predict.py at the end of the budget.

Pure Python, no torch: the planner (planner.py) ends training at the budget less this reserve,
and kagtpl's generator shows the same fractions in `kagtpl recommend`. The rule (docs/time-budget.md):
max(15% of the budget, 8% once predict.py's time is measured, the measured prediction estimate).
The measures come from the training loop (a validation pass: note_inference; the trees' start:
note_startup), growth (a grown seed's checkpoint: add_model; more TTA views: set_view_factor; the
grown seeds' judging pass at train.py's end: judge_grown) and a resumed fold's saved timing (resumed).
Nothing else writes its numbers. Under run.py predict.py's
start counts its imports until predict.py, started beside train.py, says it has paid them
(PredictStart).
It is machinery: `copier update` may replace it, so keep your own code elsewhere.
"""

from __future__ import annotations

import os

# run.py's: the file predict.py (started beside train.py) touches once its imports are paid, named in
# both children's environment (train.py's fold workers and torchrun's ranks inherit it)
READY_ENV = "KAGTPL_PREDICT_READY"


class PredictStart:
    """predict.py's start, as the reserve counts it. Alone (train.py run by hand) it is train.py's
    own start before planning: interpreter, imports, device, data. Under run.py predict.py starts
    beside train.py and touches `ready_file` once its imports are paid (submission.wait_for_train);
    from then on only what train.py did after its own imports counts (`beside_s`). Until then the
    whole start does: at nice 10 on a loaded machine predict.py's imports are paid only when CPU is
    left over, and in CI (2 cores, another test beside) it was not ready 39 s into a 40 s run
    whose train.py had kept 7.8 s, and the fallback was handed in beside a trained fold."""

    def __init__(self, startup_s: float, beside_s: float | None = None, ready_file: str = "", log=print):
        self.startup_s, self.beside_s, self.ready_file, self.log = startup_s, beside_s, ready_file, log
        self.ready = False  # predict.py said so (its file is there): its imports are paid

    def seconds(self) -> float:
        """Looked at each time the reserve is priced (a stat a training step): the file's arrival, and
        its removal (run.py starts a killed predict.py again, whose imports are not paid), each said once."""
        if self.beside_s is None or not self.ready_file:
            return self.startup_s
        ready = os.path.exists(self.ready_file)
        if ready != self.ready:
            self.ready = ready
            if ready:
                self.log(
                    f"RESERVE: predict.py is ready beside train.py (its imports paid): its start in the reserve "
                    f"is {self.beside_s:.1f}s, not {self.startup_s:.1f}s"
                )
            else:
                self.log(
                    f"RESERVE: predict.py started again beside train.py: its start in the reserve is "
                    f"{self.startup_s:.1f}s until it is ready"
                )
        return self.beside_s if ready else self.startup_s


class PredictionReserve:
    """What predict.py needs: its start (PredictStart), test decoding and end (base_s), and a share
    for each checkpoint it ensembles (fold_s): the plan's folds as they stand and the grown seeds."""

    FRACTION = 0.15  # before anything is measured
    # Once the prediction estimate is measured (the first validation pass, or the trees' start) the
    # floor under it is 8%: 15% held 81 minutes of Kaggle's 9 hours for a predict.py of minutes, and
    # capped a 10-minute image run at 0.83 of its budget (predict.py took 8.6 s of a 90 s reserve)
    MEASURED_FRACTION = 0.08
    MARGIN = 1.25  # +25% on the measured prediction estimate
    END_S = 5.0  # predict.py's end, not for folds: run.py's END_S twice + FoldClock.MARGIN_S (3 s)

    def __init__(self, budget_s: float, start: PredictStart | float = 10.0, fixed_s: float | None = None):
        self.budget = budget_s
        self.start = start if isinstance(start, PredictStart) else PredictStart(start)
        self.fixed_s = fixed_s  # seconds, instead of the rule (train.py --predict-reserve)
        self.base_s = 0.0  # predict.py's test decoding and end, measured (its start: `start`, once measured)
        self.started = False  # the start counts: a measure came (note_inference, note_startup)
        self.fold_s = 0.0  # one checkpoint's share of prediction, measured (the largest measure)
        self.extra_models = 0  # grown seeds' whole folds: predict.py ensembles them too
        self.view_factor = 1.0  # growth's TTA views over the plan's (set_view_factor): a test pass that much longer
        self.measured = False  # estimated from a measure: the floor is MEASURED_FRACTION
        self.judged_share = 0.0  # a grown seed's judging pass, in checkpoints' shares (judge_grown)

    def need_s(self, folds: int) -> float:
        """predict.py's measured need when it ensembles `folds` planned folds and the grown seeds."""
        start_s = self.MARGIN * self.start.seconds() if self.started else 0.0
        return start_s + self.base_s + (folds + self.extra_models) * self.fold_s

    def seconds(self, folds: int) -> float:
        """The reserve: --predict-reserve's seconds, else the rule (0 without a budget)."""
        if not self.budget:
            return 0.0
        if self.fixed_s is not None:  # --predict-reserve: a run that never predicts keeps 0
            return self.fixed_s
        floor = self.MEASURED_FRACTION if self.measured else self.FRACTION
        return max(floor * self.budget, self.need_s(folds))

    def budget_leaving(self, spent_s: float, folds: int) -> float:
        """The budget above which `spent_s` (the run's start, its finish) and this reserve, priced at
        that budget, leave time to train: budget - seconds(folds) - spent_s > 0 solved for the budget."""
        if self.fixed_s is not None:
            return spent_s + self.fixed_s
        floor = self.MEASURED_FRACTION if self.measured else self.FRACTION
        return max(spent_s + self.need_s(folds), spent_s / (1 - floor))

    def note_inference(self, seconds, samples, test_rows, views, decode_s_per_image, model_s=1.0) -> None:
        """Measured validation speed -> the prediction estimate: process start, then per fold a model
        build and the test set's views, plus decoding. A later fold's faster pass never lowers the
        share: predict.py's first fold pays the warm-up too (on an H100 it fell 4x at fold 1, and
        predict.py missed its deadline)."""
        per_sample, self.measured = seconds / max(samples, 1), True
        self.fold_s = max(self.fold_s, self.MARGIN * (model_s + per_sample * test_rows * views * self.view_factor))
        self.base_s, self.started = self.MARGIN * decode_s_per_image * test_rows + self.END_S, True

    def note_startup(self) -> None:
        """Models that measure no validation pass (the trees): the reserve still covers predict.py's
        start (what train.py paid before planning), with the usual margin, and its end."""
        self.base_s, self.started, self.measured = max(self.base_s, self.END_S), True, True

    def judge_grown(self, rows_share: float) -> None:
        """Grown seeds are judged at train.py's end by a pass over their folds' validation rows
        (seeds_oof.py: masks), each checkpoint's costing `rows_share` of its share here."""
        self.judged_share = rows_share

    def reserved_s(self, folds: int) -> float:
        """What training leaves before train.py's finish: this reserve and the judging pass."""
        return self.seconds(folds) + self.judging_s(folds)

    def judging_s(self, folds: int) -> float:
        """That pass, held from training: each grown checkpoint, and the first seed of each fold
        with one (at most `folds` of them)."""
        return (self.extra_models + min(folds, self.extra_models)) * self.fold_s * self.judged_share

    def add_model(self) -> None:
        """A grown seed's fold is whole: predict.py ensembles one more."""
        self.extra_models += 1

    def set_grown(self, models: int) -> None:
        """The grown seeds' checkpoints so far, as counted by a fold worker's shared queue."""
        self.extra_models = models

    def set_view_factor(self, factor: float) -> None:
        """Growth chose `factor` times the plan's TTA views (its views / the plan's): each checkpoint's
        share grows with them, and so does a later measure's (a grown seed's first validation pass,
        taken at the plan's views). Absolute, not cumulative: a fold worker sets the factor another
        worker chose (workers.FoldQueue.view_factor) before each grown unit, again and again."""
        self.fold_s *= factor / self.view_factor
        self.view_factor = factor

    def resumed(self, fold_s: float) -> None:
        """A resumed fold's saved measure of its checkpoint's share (planner.resumed_fold)."""
        if fold_s > 0:
            self.fold_s, self.measured = max(self.fold_s, fold_s), True
