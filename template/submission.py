"""The submission: fold predictions ensembled, checked against sample_submission, written atomically.

A submission that fails its check is never written: a wrong file scored on Kaggle costs a
day's submission, a missing one is caught at once. It is machinery: `copier update` may
replace it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from errors import RunError
from storage import write_csv_atomic


def ensemble(preds: list[np.ndarray], ids, normalize: bool = True) -> tuple[np.ndarray, int]:
    """Mean of the folds' predictions (class probabilities: renormalised so every row sums to 1;
    float32 softmax sums drift by ~1e-7, and the check allows 1e-4). A fold with a non-finite
    prediction (a diverged model) is left out with a warning naming the test row; NaN is never
    written, nor turned into class 0 by an argmax. No usable fold at all is a RunError.
    Returns (the ensemble, how many folds it holds)."""
    finite = []
    for k, pred in enumerate(preds):
        bad = np.flatnonzero(~np.isfinite(pred).all(axis=tuple(range(1, pred.ndim))))
        if len(bad):
            first = list(ids)[bad[0]]
            print(
                f"WARNING: model {k + 1} of {len(preds)} predicts non-finite values ({len(bad)} rows, first id "
                f"{first!r}); left out of the ensemble"
            )
            continue
        finite.append(pred)
    if not finite:
        raise RunError("no checkpoint gave usable predictions (see the warnings above); no submission written")
    mean = np.mean(np.stack(finite), axis=0).astype(np.float64)
    return (mean / mean.sum(axis=1, keepdims=True) if normalize else mean), len(finite)


def check_submission(sub, sample, kind: str, labels=None) -> None:
    """Raise ValueError unless `sub` matches sample_submission: columns, ids and their order,
    row count, and values. kind: 'distribution' (probability columns whose rows sum to 1),
    'probability' (each value in [0, 1]), 'label' (each value one of `labels`), 'number' (finite)."""
    if list(sub.columns) != list(sample.columns):
        raise ValueError(f"submission columns {list(sub.columns)[:5]}... differ from sample_submission's")
    if len(sub) != len(sample):
        raise ValueError(f"submission has {len(sub)} rows, sample_submission has {len(sample)}")
    id_col = sample.columns[0]
    bad = np.flatnonzero(sub[id_col].astype(str).to_numpy() != sample[id_col].astype(str).to_numpy())
    if len(bad):
        raise ValueError(f"submission row {bad[0]}: id {sub[id_col].iloc[bad[0]]!r} != {sample[id_col].iloc[bad[0]]!r}")
    values = sub[sample.columns[1:]]
    if kind == "label":
        allowed = {str(v) for v in labels}
        wrong = [v for v in values.to_numpy().ravel() if str(v) not in allowed]
        if wrong:
            raise ValueError(f"submission label {wrong[0]!r} is not a class")
        return
    numbers = values.to_numpy(dtype=np.float64)
    if not np.isfinite(numbers).all():
        raise ValueError("submission values must be finite")
    if kind in ("distribution", "probability") and (numbers.min() < 0 or numbers.max() > 1):
        raise ValueError("submission probabilities must be finite and within [0, 1]")
    if kind == "distribution" and not np.allclose(numbers.sum(axis=1), 1.0, atol=1e-4):
        raise ValueError("submission probabilities of a row must sum to 1")


def write_submission(sub, sample, kind: str, labels, path: Path, folds: int) -> None:
    """predict.py's end: check against sample_submission, then write atomically (or fail, writing nothing)."""
    try:
        check_submission(sub, sample, kind, labels=labels)
    except ValueError as e:
        raise RunError(f"submission failed its check, not written: {e}") from None
    write_csv_atomic(sub, path)
    print(f"SUBMISSION: {path} ({len(sub)} rows, {folds} fold(s) ensembled)")


class FoldClock:
    """predict.py's side of the time budget. Under run.py it knows the deadline (the budget's
    end); when the folds left will not fit, it first drops TTA (half the work per fold), then
    stops taking folds: the folds come best validation loss first (`best_first`), so the
    submission is made from the best folds there was time for. At least one fold always runs.
    Seam for tests: `clock` (wall seconds, time.time by default)."""

    MARGIN_S = 3.0  # ensembling, the check and the atomic write after the last fold

    def __init__(self, deadline: float | None, views: int, clock=time.time):
        self.deadline, self.views, self.clock = deadline or None, views, clock
        self.view_s: float | None = None  # seconds one fold took per view (the last fold's)
        self._t0 = 0.0

    def best_first(self, checkpoints: list) -> list:
        if self.deadline is None:
            return checkpoints
        return sorted(checkpoints, key=lambda pc: pc[1].get("val_loss", float("inf")))

    def folds(self, checkpoints: list):
        """The (path, checkpoint) pairs to predict with, best first under a deadline, as long as
        they fit; each fold is timed from its yield to the request for the next."""
        ordered = self.best_first(checkpoints)
        for k, item in enumerate(ordered):
            if not self.next_fold(k, len(ordered)):
                return
            yield item
            self.fold_done()

    def next_fold(self, done: int, total: int) -> bool:
        """Before each fold: does it fit (TTA is dropped first)? Starts the fold's timer."""
        if self.deadline is not None:
            left = self.deadline - self.clock() - self.MARGIN_S
            need = None if self.view_s is None else self.view_s * self.views * (total - done)
            if self.views > 1 and (left <= 0 or (need is not None and need > left)):
                self.views = 1
                print(f"PREDICT: {max(left, 0.0):.0f}s left before the deadline: TTA off (one view per image)")
            if done and self.view_s is not None and self.view_s * self.views > left:
                print(f"PREDICT: deadline: {done} of {total} fold(s) used, best validation loss first")
                return False
        self._t0 = self.clock()
        return True

    def fold_done(self) -> None:
        self.view_s = (self.clock() - self._t0) / self.views
