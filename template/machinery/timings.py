"""What a run measured, fold by fold: each epoch's and fold's wall time, the epochs each fold
trained, the planned folds' validation curves and the first timed steps (Timings), and where
the run stands (Progress: what the rest of a plan needs).

Pure Python, no torch: the time planner (planner.py) keeps one Timings and plans from it;
growth (growing.grow, growth.py) prices the folds it adds by it; a fold's measure is saved in its
checkpoint (fold_timing) and read back when a rerun resumes the fold (resumed).
It is machinery: `copier update` may replace it, so keep your own code elsewhere.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .durations import fmt_s


@dataclass(frozen=True)
class Progress:
    """Where the run stands: the fold being trained, its epochs done, whether it has ended, and
    how many fold workers share the later folds (--parallel folds)."""

    fold: int
    epoch: int
    fold_finished: bool
    parallel: int

    def need(self, epoch_s: float, folds: int, epochs: int) -> float:
        """Seconds the rest of a plan needs: this fold's remaining epochs, then this process's share
        of the later folds (--parallel folds: `parallel` workers take them side by side)."""
        this_fold = 0 if self.fold_finished else max(0, epochs - self.epoch)
        later = math.ceil(max(0, folds - self.fold - 1) / self.parallel)
        return (this_fold + later * epochs) * epoch_s

    def fit_epochs(self, epoch_s: float, folds: int, limit: float, most: int) -> int:
        """The most epochs (up to `most`) whose rest of the plan fits `limit`; at least 1."""
        return next((e for e in range(most, 0, -1) if self.need(epoch_s, folds, e) <= limit), 1)


def estimate_epoch(epoch_s: list[float], steady_s: float) -> float:
    """The estimate: the slowest of the last 3 epochs (estimates err on the safe side), leaving
    out the run's first epoch, which carries the warm-up, while the step-timed estimate stands in."""
    recent = epoch_s[1:][-3:]
    if recent:
        return max(recent)
    return steady_s or (epoch_s[-1] if epoch_s else 0.0)


class Timings:
    """The run's measures, on the planner's clock (monotonic seconds; a fake one in tests)."""

    WARMUP_BATCHES, MEASURE_BATCHES = 2, 5  # skip compile / cuDNN autotune, then time 5 batches

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.epoch_s: list[float] = []  # every epoch's wall time, in order
        self.fold_s: list[float] = []  # each fold's wall time, as trained by this process (growth.py reads it)
        self.fold_epochs: list[int] = []  # ...and the epochs it trained (early stopping ends some sooner)
        self.fold_planned: list[int] = []  # ...and the epochs its schedule had (the plan's then, or a grown fold's)
        self.val_curves: list[tuple[list[float], int]] = []  # the split's folds' val loss each epoch, and
        # the epochs each was planned for (growth's evidence for more epochs; a seed's fold is none)
        self.steady_epoch_s = 0.0  # the epoch's time from the timed steps after warm-up
        self.fold = self.epoch = self.batches = self.valid_batches = 0  # this fold, its epochs done, its batches
        self.fold_finished = False
        self._epoch_t0 = self._steps_t0 = self._fold_t0 = None

    def begin_fold(self, fold: int) -> None:
        self.fold, self._fold_t0, self.fold_finished, self.epoch = fold, self.clock(), False, 0

    def leave_out(self, seconds: float) -> None:
        """Seconds spent once inside an epoch (audio's export, timed for the reserve): out of this
        epoch's and fold's measured time, not out of the budget."""
        if self._epoch_t0 is not None:
            self._epoch_t0 += seconds
        if self._fold_t0 is not None:
            self._fold_t0 += seconds

    def begin_epoch(self, batches: int, valid_batches: int) -> None:
        self.batches, self.valid_batches = batches, valid_batches
        self._epoch_t0 = self.clock()

    def first_steps(self, batch: int, sync) -> float | None:
        """The first estimate's measure, called after each training batch: the steps after WARMUP_BATCHES
        (compile, cuDNN's autotune) timed over MEASURE_BATCHES; their seconds a step once measured, else
        None. `sync`: torch.cuda.synchronize on CUDA, so the timed steps are real."""
        if batch == self.WARMUP_BATCHES - 1:
            sync()
            self._steps_t0 = self.clock()
        elif self._steps_t0 is not None and batch == self.WARMUP_BATCHES - 1 + self.MEASURE_BATCHES:
            sync()
            return (self.clock() - self._steps_t0) / self.MEASURE_BATCHES
        return None

    def first_estimate(self, s_per_step: float | None) -> tuple[float, str]:
        """The first estimate of an epoch, and how it was made: from the timed steps (validation: forward
        only, batches twice as big), or the first epoch itself when it had too few batches to time steps."""
        if s_per_step is None:
            return self.epoch_s[-1], f"{fmt_s(self.epoch_s[-1])}/epoch measured"
        valid_s = s_per_step * 2 / 3 * self.valid_batches
        self.steady_epoch_s = s_per_step * self.batches + valid_s
        return self.steady_epoch_s, f"{s_per_step:.3f} s/step x {self.batches} steps + validation ~{fmt_s(valid_s)}"

    def end_epoch(self, epoch: int) -> None:
        self.epoch = epoch  # epochs of this fold done
        self.epoch_s.append(self.clock() - self._epoch_t0)

    def end_fold(self, planned: int, curve: list[float] | None = None) -> float:
        """The fold's wall time, recorded with its epochs and the epochs it was `planned` for; a
        fold of the split gives its val loss `curve` as growth's evidence with them."""
        took = self.clock() - self._fold_t0
        self.fold_finished = True
        self.fold_s.append(took)
        self.fold_epochs.append(self.epoch)
        self.fold_planned.append(planned)
        if curve is not None:
            self.val_curves.append((curve, planned))
        return took

    def shortest(self, epochs: int) -> int:
        """The fewest epochs a fold of this run was planned for (its schedule, not where early
        stopping ended it), or `epochs`, the plan's now, when fewer: how short a fold of the split
        given back may be (growing.folds_back). A plan cut to 13 epochs and given back 15 in fold 0
        and 20 in fold 1 grew no fold 2 when 15 epochs fitted: a run left 35% of its budget."""
        return min([epochs, *self.fold_planned])

    @property
    def last_epoch_s(self) -> float | None:
        return self.epoch_s[-1] if self.epoch_s else None

    def estimate(self) -> float:
        return estimate_epoch(self.epoch_s, self.steady_epoch_s)

    def progress(self, parallel: int) -> Progress:
        return Progress(self.fold, self.epoch, self.fold_finished, parallel)

    def fold_timing(self, predict_fold_s: float, planned: int) -> dict:
        """This fold's measure so far, the epochs it was `planned` for and predict.py's seconds a fold
        (reserve.py), saved in its complete checkpoint: a rerun that resumes the fold prices growth
        by it (TimePlanner.resumed_fold), not by nothing."""
        epochs = self.epoch_s[-self.epoch :] if self.epoch else []
        fold_s = self.clock() - self._fold_t0 if self._fold_t0 is not None else 0.0
        return {
            "fold_s": fold_s,
            "epochs": self.epoch,
            "planned_epochs": planned,
            "epoch_s": epochs,
            "predict_fold_s": predict_fold_s,
        }

    def resumed(self, timing) -> bool:
        """A resumed fold's recorded measure stands for this process's; False when it has none."""
        if not isinstance(timing, dict) or not float(timing.get("fold_s") or 0) > 0:
            return False
        self.fold_s.append(float(timing["fold_s"]))
        self.fold_epochs.append(int(timing.get("epochs") or 0))
        if timing.get("planned_epochs"):  # a checkpoint from before 2026-12-07 has none: the plan's now stands in
            self.fold_planned.append(int(timing["planned_epochs"]))
        self.epoch_s.extend(float(t) for t in timing.get("epoch_s") or [])
        return True
