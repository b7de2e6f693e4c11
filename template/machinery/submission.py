"""The submission: fold predictions ensembled, checked against sample_submission, written atomically.

A submission that fails its check is never written: a wrong file scored on Kaggle costs a day's
submission, a missing one is caught at once. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from . import grades, hand_in, locks, logs, planner, room, serving
from .errors import TRAIN, DataError, RunError
from .storage import read_csv

RLE = re.compile(r"(\d+ \d+( \d+ \d+)*)?")  # "start length start length ...", or "" (empty mask)


def read_table(path: Path, id_col: str):
    """A CSV with an id column whose values are unique; ids are strings ('PassengerId' 892.., 'id' 'a1f3'..:
    labels, not positions). A missing column or a duplicate id is a DataError naming the file and line."""
    df = read_csv(path, text=(id_col,))
    if id_col not in df.columns:
        raise DataError(f"{path}: no id column {id_col!r} (columns: {list(df.columns)[:10]})")
    dup = np.flatnonzero(df[id_col].duplicated().to_numpy())
    if len(dup):
        raise DataError(f"{path} line {dup[0] + 2}: duplicate id {df[id_col].iloc[dup[0]]!r}")
    return df


def in_sample_order(test, sample, id_col: str, sample_path, test_path):
    """The test rows in sample_submission's order; an id of the sample missing from the test
    table is a DataError naming the sample's line."""
    unknown = np.flatnonzero(~sample[id_col].isin(set(test[id_col])).to_numpy())
    if len(unknown):
        raise DataError(
            f"{sample_path} line {unknown[0] + 2}: id {sample[id_col].iloc[unknown[0]]!r} is not in {Path(test_path).name}"
        )
    return test.set_index(id_col).loc[sample[id_col]].reset_index()


def fill(sample, pred: np.ndarray, config: dict, classes: list, train: str = TRAIN):
    """The submission in sample_submission's shape from the ensembled predictions, and how to check its values.
    config: the checkpoint's problem, submission, metric, target(s), F1's threshold, QWK's cuts; `train`, check_classes'."""
    sub, cols = sample.copy(), list(sample.columns[1:])
    problem, kind = config["problem"], config["submission"]
    if problem == "regression":
        targets = [t for t in str(config.get("target", "")).split(",") if t]
        cols = targets if len(targets) > 1 and set(targets) <= set(cols) else cols[: pred.shape[1]]
        values = np.clip(np.expm1(pred), 0, None) if config.get("metric") == "rmsle" else pred
        if config.get("metric") == "qwk":  # whole grades, cut where the OOF rows said (grades.with_cuts) or rounded
            values = grades.whole(values, config)
        sub[cols] = values
        return sub, "number"
    if kind == "label" and config.get("metric") == "map3":  # MAP@3: the three likeliest classes, space-separated
        from .metrics import top_classes  # tables and texts only

        sub[cols[0]] = [" ".join(str(classes[k]) for k in row) for row in top_classes(pred)]
        return sub, "labels"
    if kind == "label":  # F1's cut, chosen on the OOF rows (metrics.with_threshold), or the argmax
        hard = (pred[:, 1] >= config["threshold"]).astype(int) if "threshold" in config else pred.argmax(1)
        sub[cols[0]] = [classes[k] for k in hard]
        return sub, "label"
    if problem == "binary":
        sub[cols[0]] = pred[:, 1]
        return sub, "probability"
    check_classes(cols, classes, train)
    sub[cols] = pred[:, [classes.index(c) for c in cols]]
    return sub, "probability" if problem == "multilabel" else "distribution"  # multilabel: each label's own


def check_classes(columns: list, classes: list, train: str = TRAIN) -> None:
    """sample_submission's probability columns are classes the model was trained on; one added to
    the competition since (a rerun after the sample gained a column) is a RunError naming it and
    `train`, the command that trains on this data (predict.py's runflags.train_command)."""
    new = [c for c in columns if c not in classes]
    if new:
        raise RunError(
            f"sample_submission has class column(s) {new[:5]} the checkpoints were not trained on (their "
            f"classes: {list(classes)[:10]}): the data changed since training; run {train} again"
        )


def prior_prediction(y: np.ndarray, n_classes: int, metric: str = "") -> np.ndarray:
    """What a model that saw no feature predicts, in the models' output space: the training class
    frequencies (n_classes > 0; under F1 the positive class: all the majority, often 0, scores 0),
    else each target's training mean (under MAE its median)."""
    y = np.asarray(y)
    if n_classes == 2 and metric == "f1":
        return np.array([0.0, 1.0])
    if y.dtype == object:  # a vector per row (multi-label tags): their frequencies
        return np.stack(y).astype(np.float64).mean(axis=0)
    if n_classes:
        return np.bincount(y.astype(np.int64), minlength=n_classes) / len(y)
    return (np.median if metric == "mae" else np.mean)(y.reshape(len(y), -1).astype(np.float64), axis=0)


EMPTY_KINDS = ("rle", "boxes", "box rows")  # submissions whose fallback predicts nothing: no mask, no box


def value_column(sample) -> str:
    """A mask or box submission's value column: its last, or one named (Severstal: attrs["value_column"])."""
    return sample.attrs.get("value_column", sample.columns[-1])


def empty_prediction(sample, kind: str):
    """sample_submission's rows predicting nothing: an empty mask or no box in its value column
    ("rle", "boxes"), or no row at all ("box rows": a row per box)."""
    if kind == "box rows":
        return sample.iloc[:0].copy()
    return sample.assign(**{value_column(sample): ""})


def write_fallback(path: Path, sample, y: np.ndarray, config: dict, classes: list, since: float = float("inf")):
    """The submission that exists from preflight on, so that a run stopped anywhere still hands one in: every
    row the training prior (class frequencies, the majority class, or the mean). A submission already at
    `path` written before `since` (the run's start: --start-time) is an earlier run's (a dry run's, or one
    from other data): moved to `submission.earlier.csv` with a line, so that the file this run hands in is
    its own; one written since is this run's (a train.py run.py started again), replaced where it is.
    Returns it and its kind (fill's: "label", "number", ...), or None when there is none."""
    if config.get("submission") in EMPTY_KINDS:  # segmentation, detection: an empty mask, no box
        sub, kind = empty_prediction(sample, config["submission"]), config["submission"]
    else:
        n_classes = 0 if config["problem"] in ("regression", "multilabel") else len(classes)  # multilabel: shares
        prior = prior_prediction(y, n_classes, config.get("metric", ""))
        sub, kind = fill(sample, np.tile(prior, (len(sample), 1)), config, classes)
        if kind == "distribution" and not np.isclose(prior.sum(), 1.0):
            kind = "probability"  # several tags per row (multi-label): a probability per tag
    try:
        check_submission(sub, sample, kind, labels=classes)
    except ValueError as e:  # a competition edited past what fill() knows: training goes on without one
        print(f"WARNING: no fallback submission ({e}); predict.py writes the first")
        return None
    if path.is_file() and path.stat().st_mtime < since:
        earlier = path.with_name(f"{path.stem}.earlier{path.suffix}")
        os.replace(path, earlier)
        print(f"SUBMISSION: the earlier run's {path.name} moved to {earlier} (this run hands in its own)")
    room.write_csv(sub, path, ahead=True)  # a full disk: train.py's training cache is in use
    what = {
        "number": {"mae": "the training median", "qwk": "the rounded training mean"}.get(
            config.get("metric"), "the training mean"
        ),
        "label": "the positive class" if config.get("metric") == "f1" else "the majority class",
        "labels": "the three most common classes",
        "rle": "an empty mask",
        "boxes": "no box",
        "box rows": "no box",
    }.get(kind, "class priors")
    print(f"SUBMISSION: {path} is a fallback ({what} for every row) until predict.py replaces it")
    return sub, kind


class FoldMean:
    """The mean of the folds' predictions as a running sum: one array in memory however many
    folds (a segmentation fold is images x classes x H x W of probabilities). A fold with a
    non-finite prediction (a diverged model) is left out with a warning naming the test row; NaN is
    never written, nor turned into class 0 by an argmax."""

    def __init__(self, ids, folds: int, dtype=np.float64):
        self.ids, self.folds, self.dtype = list(ids), folds, dtype
        self.sum, self.count, self.seen = None, 0, 0

    def add(self, pred: np.ndarray) -> None:
        self.seen += 1
        bad = np.flatnonzero(~np.isfinite(pred).all(axis=tuple(range(1, pred.ndim))))
        if len(bad):
            print(
                f"WARNING: model {self.seen} of {self.folds} predicts non-finite values ({len(bad)} rows, first id "
                f"{self.ids[bad[0]]!r}); left out of the ensemble"
            )
        elif self.sum is None:
            self.sum, self.count = pred.astype(self.dtype), 1  # a copy: the caller's array is not summed into
        else:
            self.sum += pred
            self.count += 1

    def mean(self, normalize: bool = True) -> tuple[np.ndarray, int]:
        """(the mean, how many folds it holds); class probabilities renormalised to sum to 1 a row (float32
        softmax sums drift by ~1e-7; the check allows 1e-4). No usable fold at all is a RunError."""
        if not self.count:
            raise RunError("no checkpoint gave usable predictions (see the warnings above); no submission written")
        mean = self.sum / self.count
        return (mean / mean.sum(axis=1, keepdims=True) if normalize else mean), self.count


def ensemble(preds: list[np.ndarray], ids, normalize: bool = True) -> tuple[np.ndarray, int]:
    """FoldMean of predictions already in a list (a table's or a text's folds are small), as float64."""
    folds = FoldMean(ids, len(preds))
    for pred in preds:
        folds.add(pred)
    return folds.mean(normalize)


def check_layout(sub, sample) -> None:
    """Raise ValueError unless `sub` has sample_submission's columns, row count, and ids in its order."""
    if list(sub.columns) != list(sample.columns):
        raise ValueError(f"submission columns {list(sub.columns)[:5]}... differ from sample_submission's")
    if len(sub) != len(sample):
        raise ValueError(f"submission has {len(sub)} rows, sample_submission has {len(sample)}")
    id_col = sample.columns[0]
    # byte for byte: the ids are text on both sides (00200 is not 200), never converted to compare
    bad = np.flatnonzero(sub[id_col].to_numpy(dtype=object) != sample[id_col].to_numpy(dtype=object))
    if len(bad):
        raise ValueError(f"submission row {bad[0]}: id {sub[id_col].iloc[bad[0]]!r} != {sample[id_col].iloc[bad[0]]!r}")


def check_submission(sub, sample, kind: str, labels=None) -> None:
    """Raise ValueError unless `sub` matches sample_submission: columns, ids and their order, row count,
    and values. kind: 'rle' (run-length strings), 'boxes' (prediction strings, "" for no box), 'distribution'
    (rows sum to 1), 'probability' (in [0, 1]), 'label' (one of `labels`), 'labels' (several, space-separated:
    MAP@3), 'number' (finite); 'box rows' (a row per box: the sample's columns, its rows only examples)."""
    if kind == "box rows":
        if list(sub.columns) != list(sample.columns):
            raise ValueError(f"submission columns {list(sub.columns)[:7]} differ from sample_submission's")
        return
    check_layout(sub, sample)
    values = sub[sample.columns[1:]]
    if kind == "rle":  # segmentation: the value column is an RLE string ("" = an empty mask)
        bad = [v for v in sub[value_column(sample)] if not isinstance(v, str) or not RLE.fullmatch(v)]
        if bad:
            raise ValueError(f"submission RLE {str(bad[0])[:40]!r} is not start/length pairs")
        return
    if kind == "boxes":
        bad = [v for v in sub[value_column(sample)] if not isinstance(v, str)]
        if bad:
            raise ValueError(f"submission prediction string {bad[0]!r} is not text")
        return
    if kind in ("label", "labels"):
        allowed = {str(v) for v in labels}
        tokens = (lambda v: str(v).split(" ")) if kind == "labels" else (lambda v: [str(v)])
        wrong = [v for v in values.to_numpy().ravel() if not set(tokens(v)) <= allowed]
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
    room.write_csv(sub, path)
    print(f"SUBMISSION: {path} ({len(sub)} rows, {folds} fold(s) ensembled)")


class FoldClock:
    """predict.py's side of the time budget. Under run.py it knows the deadline (the budget's end) and
    measures its rate on the first test batches: when the rest of a fold will not fit, it drops TTA
    (the rows already predicted keep their two views), then stops the fold and leaves it out. Folds
    come best validation loss first (`best_first`), each taken only when its measured time fits;
    when not even the first fits, `cut` is set and predict.py keeps the submission it has (`keep`).
    `hard_stop`: run.py stops predict.py at the budget (`--after-train`), so the first fold is never
    left out for the deadline (on an H100 a detection run with 3 trained folds handed in the
    fallback: its first batch ended past the deadline). Seam for tests: `clock` (time.time)."""

    MARGIN_S = 3.0  # ensembling, the check and the atomic write after the last fold

    def __init__(self, deadline: float | None, views: int, clock=time.time, hard_stop: bool = False):
        self.deadline, self.views, self.clock, self.hard_stop = deadline or None, views, clock, hard_stop
        self.done, self.cut = 0, False  # folds finished; whether a fold was stopped by the deadline
        self.view_s: float | None = None  # seconds one fold took per view (the last fold's)
        self._t0, self._total = 0.0, 0  # this fold's start and its rows in all
        self._rows = 0, 0.0, None  # this fold's rows, view-rows, (view-rows, time) at its first batch's end

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

    def left(self) -> float:
        return self.deadline - self.clock() - self.MARGIN_S

    def next_fold(self, done: int, total: int) -> bool:
        """Before each fold: does it fit (TTA is dropped first)? Starts the fold's timer."""
        if self.deadline is not None:
            left = self.left()
            need = None if self.view_s is None else self.view_s * self.views * (total - done)
            if self.views > 1 and (left <= 0 or (need is not None and need > left)):
                self.views = 1
                print(f"PREDICT: {max(left, 0.0):.0f}s left before the deadline: TTA off (one view per row)")
            if self.cut or (done and self.view_s is not None and self.view_s * self.views > left):
                print(f"PREDICT: deadline: {done} of {total} fold(s) used, best validation loss first")
                return False
        self._t0, self._rows, self.done = self.clock(), (0, 0.0, None), done
        return True

    def batch_done(self, rows: int, total: int) -> bool:
        """After each test batch of a fold (`rows` predicted of `total`): False stops the fold.
        The rate is measured from the first batch's end (its time holds the warm-up: cuDNN's
        autotune, the loader's start) once a second batch is done."""
        if self.deadline is None or rows >= total:  # a finished fold is kept, however late
            return True
        self._total = total
        now, (done, view_rows, first) = self.clock(), self._rows
        view_rows += (rows - done) * self.views
        if first is None:
            first, stop = (view_rows, now), self.left() <= 0
        else:
            row_s = (now - first[1]) / max(view_rows - first[0], 1e-9)  # seconds per row and view
            if self.views > 1 and (total - rows) * self.views * row_s > self.left():
                self.views = 1
                print(f"PREDICT: {rows} of {total} rows at {1 / max(row_s, 1e-9):.0f} rows/s: TTA off for the rest")
            stop = (total - rows) * self.views * row_s > self.left()
        self._rows = rows, view_rows, first
        stop = stop and not (self.hard_stop and self.done == 0)  # the first fold runs on to run.py's stop
        if stop:
            self.cut = True
            print(f"PREDICT: deadline: this fold would not finish ({rows} of {total} rows predicted): left out")
        return not stop

    def fold_done(self) -> None:
        """The fold's seconds per view, for the next fold's check. The first fold's is its steady
        rate (from its first batch's end) over all its rows: its whole time holds the warm-up paid
        once (cuDNN's autotune, the loader's and the card's start), and taken as the rate it turned
        TTA off before the second checkpoint ("16 s left ... TTA off", then predict.py done in 9.7 s).
        A later fold's whole time is its rate: its own start (the model's load) is paid by every fold."""
        now, (_, view_rows, first) = self.clock(), self._rows
        self.view_s = (now - self._t0) / self.views
        if self.done == 0 and first is not None and view_rows > first[0] and self._total:
            row_s = (now - first[1]) / (view_rows - first[0])  # seconds per row and view, warm-up left out
            self.view_s = min(self.view_s, row_s * self._total)


def keep(path: Path, sample, kind: str = "") -> None:
    """No fold finished before the deadline: the submission already at `path` stays, when it
    has sample_submission's columns and ids (train.py's fallback, unless predict.py ran since);
    `kind` "box rows": its columns (a row per box: the sample's rows are only examples)."""
    why = layout_problem(path, sample, kind)
    if why:
        raise RunError(
            f"no fold finished before the deadline and {path} is not a submission for this test set (other ids, "
            f"columns or rows than sample_submission: {why})"
        )
    print(
        f"SUBMISSION: {path} kept: no fold finished before the deadline (train.py's fallback unless predict.py ran since)"
    )


def layout_problem(path: Path, sample, kind: str = "") -> str | None:
    """Why the submission at `path` is not one for `sample`'s rows (unreadable, other columns, ids
    or rows; "box rows": other columns), or None when it is."""
    import pandas as pd

    try:
        if kind == "box rows":  # train.py's fallback has no row, predict.py's a row per box: the header says
            check_submission(pd.read_csv(path, nrows=0), sample, kind)
        else:
            check_layout(read_csv(path, text=(0,)), sample)
    except (OSError, DataError, ValueError) as e:  # pandas' EmptyDataError (0 bytes) is a ValueError
        return str(e)
    return None


def hand_in_first(path: Path, rows, defaults: dict, kind: str = "") -> None:
    """Under a deadline, before any fold: a submission of this test set's `rows` at `path`, so a run the platform
    kills at its limit still hands one in. The one there stays when it has these rows (train.py's fallback, or
    an earlier predict.py's); otherwise (Kaggle's hidden rerun: rows train.py never saw) every row gets the
    training prior, serve_defaults.json's `defaults`, as serve.py answers before its first good batch, or, for
    masks and boxes (`kind`: EMPTY_KINDS), an empty prediction. The folds' predictions replace it."""
    if layout_problem(path, rows, kind) is None:
        return
    empty = kind in EMPTY_KINDS
    room.write_csv(empty_prediction(rows, kind) if empty else serving.fallback(rows, defaults, None), path)
    what = hand_in.kind_words(kind)
    said = "no box" if kind == "box rows" else f"{what} for all {len(rows)} rows"  # a row per box: none
    print(f"SUBMISSION: {path} holds {said} until the folds replace it")


ORPHAN_WAIT_S = 120.0  # predict.py after run.py died: how long train.py may take to save and end (SIGTERM)


def import_beside(modules: tuple[str, ...]) -> None:
    """The model's libraries, imported before run.py's `go` (predict.py's `preload`): they are
    otherwise imported where the first fold's model is built, after it, on the deadline's path.
    timm alone pulls in torchvision and torch._dynamo (sympy): 5 s on an H200 machine's CPU, of
    the 10.6-12.9 s predict.py took after `go` in every task there. One that fails to import is
    left to fail where the model is built, with that task's own message."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # any failure: the import after `go` raises it again, where the task explains it
            continue


def say_ready() -> None:
    """predict.py's imports are paid: the file run.py named (reserve.READY_ENV) is touched, and
    train.py's reserve leaves them out from then on (reserve.PredictStart). One that cannot be
    written leaves the reserve as it was: with the whole start in it."""
    path = os.environ.get(planner.READY_ENV)
    if path:
        try:
            Path(path).touch()
        except OSError:
            return


def wait_for_train(after_train: bool, out_dir: Path, preload: tuple[str, ...] = ()) -> bool:
    """run.py starts predict.py (`--after-train`) together with train.py: its interpreter and imports (torch, timm,
    transformers, the project: seconds; on an H100 predict.py took 15-23 s in all and the budget had kept 14 s
    for it) are paid while train.py trains, off the deadline's path, and so are the libraries the scripts import
    only where they build the model (`preload`: import_beside). Then it says it is ready (say_ready) and waits
    for run.py's `go` on stdin (train.py has ended: its checkpoints are written), before touching the GPU (the
    training's). When run.py dies instead (its stdin ends without `go`), train.py gets SIGTERM with it (a
    parent-death signal) and saves: predict.py waits for train.py's lock on the folder, then hands in the
    checkpoints itself. Then, under run.py or not, it holds the folder's lock while it predicts (a folder
    another train.py trains in is a RunError, written into by nobody), and its lines go to predict.log there
    too, written anew (logs.keep_log). Returns whether run.py is there to stop it at the budget
    (FoldClock.hard_stop)."""
    out_dir, word, said = Path(out_dir), None, ""  # None: not run.py's (no `go` to wait for)
    if after_train:
        import_beside(preload)
        say_ready()
        ready, t0 = planner.process_age(), time.time()
        try:
            word = sys.stdin.readline().strip()
        except (OSError, ValueError):  # no stdin at all
            word = ""
        if word != "go":  # said now, while it waits for the lock; predict.log gets it once opened
            said = "PREDICT: run.py ended before train.py did: waiting for train.py to save, then predicting on its own"
            print(said, flush=True)
    if out_dir.is_dir():
        locks.lock_output(out_dir, "predict.py", wait=0.0 if word in (None, "go") else ORPHAN_WAIT_S)
        logs.keep_log(out_dir / "predict.log", said)  # its holder's alone: a predict.py refused the folder writes none
    if word == "go":
        print(f"PREDICT: started beside train.py: ready in {ready:.1f}s, then waited {time.time() - t0:.1f}s for it")
    return word == "go"
