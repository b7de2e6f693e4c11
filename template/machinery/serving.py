"""Kaggle's evaluation API (serve.py): the competition's inference server around predict.py's
per-call function, timed and guarded so that one bad batch never costs the submission.

The competition ships a `kaggle_evaluation` package in its data. Its `<name>_inference_server.py`
holds a class built from a function named `predict`: its `serve()` answers Kaggle's gateway during
the rerun on the hidden set (KAGGLE_IS_COMPETITION_RERUN set), its `run_local_gateway(paths)`
calls it on the public test files. The server must be up within the serving deadline (15 minutes
after the notebook starts in the competitions seen so far); each call after the first has a
limit of its own. Every answer here is checked before it goes out (the batch's rows, its ids in
order); a call that raises, answers wrong, or is still running at 80% of its limit is answered
with the fallback instead: the last good answer's values (each column's mean, or its most common
value: a class label's always) for this batch's ids, or train.py's fallback (the training prior)
before any good answer; for masks and boxes, always train.py's (the empty masks, no boxes:
tasks.Task.carries_answers).
It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from . import tasks
from .errors import TRAIN, RunError
from .storage import atomic_write

DEFAULTS_FILE = "serve_defaults.json"  # train.py's fallback values, one row's worth
LIMIT_SHARE = 0.8  # a call still running at this share of its limit is answered with the fallback
STARTUP_SHARE = 0.9  # of the serving deadline for loading folds: the rest starts the server
HELD_SHARE = 0.5  # of the device's memory, for the folds serve.py keeps loaded (the rest: activations, the batch)
PROGRESS_EVERY = 100  # calls between SERVE progress lines


def process_start() -> float:
    """When this process started (unix time): the serving deadline counts from the notebook's
    start, and this process is the nearest measure of it (serve.py --started gives the real one)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


# ----------------------------------------------------------------------------- the answers' shape


def write_defaults(out_dir: Path, sub: pd.DataFrame, kind: str, signature: str) -> None:
    """serve_defaults.json beside train.py's fallback submission: its id column and one row's
    values (the training prior is the same for every row), serve.py's answer before a good one,
    their kind (submission.fill's: "label" for class labels, whose failed call's fallback is the
    last answer's most common label, never a mean: the mean of labels 0-4 is no class), and the
    run signature they were made under (check_run). Masks and boxes: the column they answer in
    (submission.value_column: the last, or Severstal's EncodedPixels before its ClassId)."""
    from .submission import value_column  # it imports this module

    row = {c: (v.item() if hasattr(v, "item") else v) for c, v in sub.iloc[0, 1:].items()} if len(sub) else {}
    found = {"id_col": sub.columns[0], "values": row, "columns": list(sub.columns), "kind": kind}
    found["value_column"] = value_column(sub)
    text = json.dumps({**found, "signature": signature})
    atomic_write(Path(out_dir) / DEFAULTS_FILE, lambda tmp: Path(tmp).write_text(text))


def read_defaults(out_dir: Path, train: str = TRAIN) -> dict:
    """serve_defaults.json, checked; `train`, the command that writes it (runflags.train_command)."""
    path = Path(out_dir) / DEFAULTS_FILE
    if not path.is_file():
        raise RunError(f"no {path}: train.py writes it with its fallback submission; run {train} first")
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # cut short, not JSON, not UTF-8
        raise RunError(f"{path} does not read ({type(e).__name__}): run {train} again to write it") from None
    columns = found.get("columns") if isinstance(found, dict) else None
    if (
        not isinstance(columns, list)
        or not columns
        or not all(isinstance(c, str) for c in columns)
        or found.get("id_col") != columns[0]
        or not isinstance(found.get("values"), dict)
    ):
        raise RunError(f"{path} is not train.py's (id_col, values, columns): run {train} again to write it")
    return found


def to_pandas(frame) -> pd.DataFrame:
    """The gateway's frame (polars or pandas) as pandas, which the project's code reads."""
    return frame if isinstance(frame, pd.DataFrame) else frame.to_pandas()


def like(batch, answer: pd.DataFrame):
    """The answer in the batch's frame type: a competition that sends polars gets polars back."""
    if isinstance(batch, pd.DataFrame) or type(batch).__module__.split(".")[0] != "polars":
        return answer
    import polars as pl

    return pl.from_pandas(answer)


def answer_frame(ids, columns: list) -> pd.DataFrame:
    """sample_submission's columns for a batch's ids (as sent: the gateway compares them), the
    values left to fill: what submission.fill and the like fill, per batch."""
    return pd.DataFrame({c: ids if c == columns[0] else None for c in columns})


def fallback(batch, defaults: dict, last: pd.DataFrame | None) -> pd.DataFrame:
    """The batch's ids with the last good answer's values (a number column's mean; a class label's,
    numbers too, or another column's most common value), or serve_defaults.json's before any good
    answer. Masks and boxes (submission.EMPTY_KINDS) answer in their value column (the last, unless
    serve_defaults.json names another): a column beside it that the batch carries is the batch's, as
    predict_batch keeps it (a long format's class: id, class, rle), not one class on every row."""
    from .submission import EMPTY_KINDS  # it imports this module

    id_col, labels = defaults["id_col"], defaults.get("kind") == "label"
    frame = batch_frame(batch)  # converted once: its ids, and the columns masks and boxes echo
    out = pd.DataFrame({id_col: batch_ids(frame, id_col)})
    given = frame if len(out) and defaults.get("kind") in EMPTY_KINDS else None
    answered = defaults.get("value_column", defaults["columns"][-1])  # an older run's file: the last
    for c in defaults["columns"][1:]:
        if given is not None and c in given.columns and c != answered:
            out[c] = given[c].to_numpy()
        elif last is not None and c in last.columns and len(last):
            column = last[c]
            averaged = pd.api.types.is_numeric_dtype(column) and not labels
            out[c] = column.mean() if averaged else column.mode().iloc[0]
        else:
            out[c] = defaults["values"].get(c)
    return out


def prior_answer(defaults: dict, _state: dict, batch, *_args, **_kwargs) -> pd.DataFrame:
    """serve.py's predict_batch when the run judged its folds worse than the training prior
    (hand_in.py): the prior, serve_defaults.json's values, for every row of every call."""
    return fallback(batch, defaults, None)


def batch_ids(frame: pd.DataFrame | None, id_col: str) -> np.ndarray:
    """The batch's ids as sent (`frame`: batch_frame's); a batch that is not a frame (None), or has
    no id column, gets a row per row with no id (the gateway will say what it wanted): the fallback
    never raises."""
    if frame is None:
        return np.array([], dtype=object)
    return frame[id_col].to_numpy() if id_col in frame.columns else np.full(len(frame), None, dtype=object)


def batch_frame(batch) -> pd.DataFrame | None:
    """The batch as a pandas frame, or None where it is not one."""
    try:
        return to_pandas(batch)
    except (AttributeError, TypeError, ValueError):
        return None


def batch_rows(batch) -> int | None:
    try:
        return len(batch)
    except TypeError:
        return None


def check_answer(answer, batch, id_col: str) -> pd.DataFrame:
    """The gateway's own check, made first: the batch's row count and ids, in order."""
    if answer is None:
        raise ValueError("no answer (None)")
    answer = to_pandas(answer)
    ids = to_pandas(batch)[id_col]
    if len(answer) != len(ids):
        raise ValueError(f"{len(answer)} rows for a batch of {len(ids)}")
    if id_col not in answer.columns or [str(v) for v in answer[id_col]] != [str(v) for v in ids]:
        raise ValueError(f"its {id_col} column is not the batch's, in the batch's order")
    return answer


# ----------------------------------------------------------------------------- one call


class Answerer:
    """What the gateway calls, once per batch: `fn(state, *args, **kwargs)` (predict.py's
    predict_batch with its ensemble bound) in a worker thread, timed against the call's limit.
    `state` is one dict kept across calls, for a competition that streams (a rolling window,
    lags); a call answered by the fallback may still finish later and update it. `task`: the
    registry's, whose fallback answers a failed call (tasks.Task.carries_answers)."""

    def __init__(self, fn, defaults: dict, call_limit: float, first_limit: float, task: tasks.Task):
        self.fn, self.defaults, self.task = fn, defaults, task
        self.limits = first_limit, call_limit
        self.pool = ThreadPoolExecutor(max_workers=1)  # one call at a time: a late one delays the next
        self.state: dict = {}
        self.last: pd.DataFrame | None = None
        self.calls = self.rows = self.fallbacks = 0
        self.slowest = 0.0

    def __call__(self, batch, *args, **kwargs):
        limit = self.limits[self.calls > 0]
        self.calls += 1
        if batch_rows(batch) == 0:  # a legal empty batch: an empty answer, not a failure
            ids = batch_ids(batch_frame(batch), self.defaults["id_col"])
            return like(batch, answer_frame(ids, self.defaults["columns"]))
        t0 = time.time()
        future = self.pool.submit(self.fn, self.state, batch, *args, **kwargs)
        try:
            answer = check_answer(future.result(timeout=limit * LIMIT_SHARE), batch, self.defaults["id_col"])
        except Exception as e:  # whatever one batch does (noqa BLE001), the next batches are answered
            why = (
                f"still running after {time.time() - t0:.1f}s ({LIMIT_SHARE:.0%} of its {limit:g}s limit)"
                if not future.done()
                else f"raised {type(e).__name__}: {e}"
                if future.exception() is not None
                else f"answered wrong ({e})"
            )
            return self.answer_fallback(batch, why)
        took = time.time() - t0
        self.slowest, self.rows = max(self.slowest, took), self.rows + len(answer)
        self.last = answer if self.task.carries_answers else None  # masks, boxes: never another image's
        if self.calls == 1 or self.calls % PROGRESS_EVERY == 0:
            print(f"SERVE: call {self.calls}: {len(answer)} rows in {took:.2f}s; {self.summary()}", flush=True)
        return like(batch, answer)

    def answer_fallback(self, batch, why: str):
        self.fallbacks += 1
        source = "the last good answer's values" if self.last is not None else self.task.fallback
        print(f"WARNING: SERVE: call {self.calls} {why}: answered with the fallback ({source})", flush=True)
        answer = fallback(batch, self.defaults, self.last)
        self.rows += len(answer)
        return like(batch, answer)

    def summary(self) -> str:
        return (
            f"{self.calls} call(s), {self.rows} rows, {self.fallbacks} fallback(s), "
            f"slowest {self.slowest:.2f}s (limit {self.limits[1]:g}s)"
        )


# ----------------------------------------------------------------------------- start-up


class StartClock:
    """The serving deadline: `limit` seconds from `started`; folds load while it has time, and
    while their weights fit `room` bytes (HELD_SHARE of the device's memory; 0: no limit)."""

    def __init__(self, started: float, limit: float, clock=time.time, room: int = 0):
        self.started, self.limit, self.clock, self.room = started, limit, clock, room

    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        """Seconds left for loading: the deadline's STARTUP_SHARE, less what has gone."""
        return self.limit * STARTUP_SHARE - self.elapsed()


def weights_bytes(ckpt: dict) -> int:
    """The bytes of a checkpoint's weights (its state dict's tensors; a booster's spec: 0)."""
    state = ckpt.get("model") if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        return 0
    return sum(t.numel() * t.element_size() for t in state.values() if hasattr(t, "element_size"))


def load_folds(checkpoints: list, load, clock: StartClock) -> list:
    """(path, checkpoint, model) for the folds that load before the serving deadline and whose
    weights fit the room the device has for them (`clock.room`), best validation loss first (the
    first always: a server answering from one fold beats none). serve.py keeps every fold it
    serves loaded: 25 grown checkpoints of deberta-v3-base are ~18.5 GB, past a T4's 15 GB. A fold
    whose load (the slowest so far) would pass what is left, or whose weights would pass the
    room, is dropped with the rest."""
    check_run(checkpoints)
    ordered = sorted(checkpoints, key=lambda pc: pc[1].get("val_loss", float("inf")))
    loaded, slowest, held = [], 0.0, 0
    for i, (path, ckpt) in enumerate(ordered):
        names = ", ".join(p.name for p, _ in ordered[i:])
        if loaded and slowest > clock.left():
            print(
                f"SERVE: start-up: {len(ordered) - i} fold(s) dropped ({names}): one loads in {slowest:.1f}s and "
                f"{max(clock.left(), 0):.1f}s is left of the {clock.limit:g}s serving deadline's {STARTUP_SHARE:.0%}"
            )
            break
        size = weights_bytes(ckpt)
        if loaded and clock.room and held + size > clock.room:
            print(
                f"SERVE: start-up: {len(ordered) - i} fold(s) dropped ({names}): {len(loaded)} fold(s) hold "
                f"{held / 1e6:.0f} MB and the next {size / 1e6:.0f} MB would pass the {clock.room / 1e6:.0f} MB "
                f"the device has for them ({HELD_SHARE:.0%} of its memory)"
            )
            break
        t0 = clock.clock()
        model = load(path, ckpt)
        slowest = max(slowest, clock.clock() - t0)
        if model is not None:  # weights that do not fit: skipped, as predict.py does
            loaded.append((path, ckpt, model))
            held += size
    if not loaded:
        raise RunError("no checkpoint could be loaded: serve.py has no model to answer with")
    return loaded


def check_run(checkpoints: list) -> None:
    """serve_defaults.json (the fallback's values, the answer's columns) and the folds are of one
    run signature: a newer train.py run on other data, stopped before its first fold, leaves its
    defaults beside an older run's folds (a RunError: answers of one and fallbacks of the other)."""
    path = Path(checkpoints[0][0]).parent / DEFAULTS_FILE
    made = read_defaults(path.parent).get("signature") if path.is_file() else None
    runs = sorted({c.get("config", {}).get("signature") for _, c in checkpoints} - {None})
    if made and runs and made not in runs:
        raise RunError(
            f"{path.name} was written by a train.py run of signature {made}, {Path(checkpoints[0][0]).name} and its "
            f"folds by one of {', '.join(runs)} (other data, target or folds): run train.py again on the data of "
            f"the run to serve (the newer one's trains its folds; the older one's writes {path.name} again and "
            f"keeps its complete folds)"
        )


def find_server(data_dir: Path):
    """The competition's InferenceServer class, from <data_dir>/kaggle_evaluation/*_inference_server.py
    (the package and its folder go first on sys.path: some servers import their gateway by name)."""
    package = Path(data_dir) / "kaggle_evaluation"
    found = sorted(package.glob("*inference_server.py"))
    if not found:
        raise RunError(
            f"no kaggle_evaluation/*_inference_server.py in {data_dir}: serve.py is for competitions served "
            f"through Kaggle's evaluation API, which ship that package with their data (--data-dir)"
        )
    sys.path[:0] = [str(package.parent.resolve()), str(package.resolve())]
    module = importlib.import_module(f"kaggle_evaluation.{found[0].stem}")
    base = importlib.import_module("kaggle_evaluation.core.templates").InferenceServer
    servers = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, base) and v is not base]
    if not servers:
        raise RunError(f"{found[0]} defines no InferenceServer class")
    return servers[0]


def rerun() -> bool:
    return os.getenv("KAGGLE_IS_COMPETITION_RERUN") is not None


def check_dry_run(path: Path, answerer: Answerer) -> None:
    """What the local gateway wrote: every answered row, sample_submission's columns, no missing
    value; a fallback answer is a WARNING (a call that failed here fails in the rerun too)."""
    if not path.is_file():
        raise RunError(f"the local gateway wrote no {path}")
    sub = pd.read_parquet(path)
    if len(sub) != answerer.rows:
        raise RunError(f"{path} has {len(sub)} rows, {answerer.rows} were answered")
    missing = int(sub.isna().sum().sum())
    columns = answerer.defaults["columns"]
    print(f"SERVE: {path}: {len(sub)} rows, columns {list(sub.columns)}, {missing} missing value(s)")
    if list(sub.columns) != columns:
        print(f"WARNING: SERVE: {path} has columns {list(sub.columns)}; sample_submission's are {columns}")
    if missing or answerer.fallbacks:
        print(f"WARNING: SERVE: {answerer.fallbacks} call(s) answered by the fallback, {missing} missing value(s)")
