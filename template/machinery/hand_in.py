"""What the run hands in, by the run's own evidence: the folds or train.py's fallback, and the
grown seeds or not. Both are decided on the OOF rows with a test that knows noise: a paired
bootstrap (RESAMPLES resamples of the rows, both candidates scored on each with the
competition's metric; fewer, down to LEAST_RESAMPLES, when the metric is slow: an audio task's
cmAP and AUC over 8 classes took ~6 s for 200); a candidate loses when it scores worse in at
least CONFIDENCE of them.

- **Folds or the fallback.** The folds' OOF predictions against the training prior (what the
  fallback submission holds, the same for every row). Folds that lose (a budget of one epoch:
  OOF log loss 4.76 against the prior's 2.30 on ten classes) are not handed in: a HAND-IN line,
  and predict.py keeps the fallback with one line. A competition whose fallback is not the prior
  gives it as OOF rows of its own (`fallback_oof`; tasks.py names it): segmentation's empty masks,
  which beat an undertrained model where most images have no mask. A table's models are judged
  together, as the blend predict.py makes (blend.judge), never the MLP alone; the verdict then
  covers the trees' fold test files too (JUDGED). Boxes are not judged (no box scores 0 on mAP).
- **Grown seeds.** A fold's first seed alone against its grown seeds averaged in (growth.py), on
  the folds that have them: seeds that lose are left out of the OOF, the CV and predict.py's
  ensemble, as the GROW: OOF line says (a table's MLP went 0.9000 -> 0.8583 with its seeds kept).

Each verdict is a section of output/hand_in.json, with the files it judged and their
modification times: a verdict on files rewritten since (a rerun retrained them) is ignored.
Torch-free. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import tasks
from .durations import process_age
from .errors import KeptFallback, NothingTrained, RunError
from .storage import atomic_write

if TYPE_CHECKING:  # numpy is imported where it is used: kagtpl kaggle reads the verdicts without it
    import numpy as np

FILE = "hand_in.json"
RESAMPLES = 200  # paired bootstrap resamples of the OOF rows: the share is known to +-3% at 50%
LEAST_RESAMPLES, BOOTSTRAP_S = 50, 2.0  # past 2 s of scoring, stop at the 50th resample or later
CONFIDENCE = 0.95  # a candidate loses when it scores worse in this share of the resamples
# ...so a loser is not worse in at most 10 of RESAMPLES (fewer, of fewer counted): past that, it wins.
# judge stops there, its verdict the same: every train.py run ends with it, and the 200 resamples
# took 0.8 s of the 4.2 s a 240-digit run spent after its imports (py-spy, one thread); 11 take 0.05 s
LOSER_NOT_WORSE = round((1 - CONFIDENCE) * RESAMPLES)
# A process's start is read in 10 ms ticks and a file's time from a coarse clock: a file written
# within ms of predict.py's start read as older than it (1 full suite in 2). train.py's fallback
# comes seconds after (its preflight); an earlier run's file is older by a run.
CLOCK_SLACK_S = 0.1


def last_metric(comp):
    """The competition's metric (the last of comp.score's) as a function of (y, predictions)."""
    return lambda y, pred: float(list(comp.score(y, pred).values())[-1])


def worse_share(score, y: np.ndarray, a: np.ndarray, b: np.ndarray, higher: bool, seed: int = 0, decided=False):
    """Paired bootstrap over the rows: (the share of resamples in which `a` scores worse than `b`
    on the same rows, a tie not worse; the resamples counted). RESAMPLES of them, or fewer past
    BOOTSTRAP_S seconds (never under LEAST_RESAMPLES). A resample the metric does not define (an
    AUC on one class) is not counted. `decided`: stop once `a` can no longer lose (more resamples
    not worse than CONFIDENCE leaves of RESAMPLES): the same verdict, in 11 resamples where `a`
    clearly wins; the share is then no estimate (judge prints it only where `a` loses)."""
    import numpy as np

    rng, worse, counted, t0 = np.random.default_rng(seed), 0, 0, time.perf_counter()
    for i in range(RESAMPLES):
        if i >= LEAST_RESAMPLES and time.perf_counter() - t0 > BOOTSTRAP_S:
            break
        idx = rng.integers(0, len(y), len(y))
        try:
            sa, sb = score(y[idx], a[idx]), score(y[idx], b[idx])
        except (ValueError, ZeroDivisionError, IndexError):
            continue
        counted += 1
        worse += bool(sa < sb if higher else sa > sb)
        if decided and counted - worse > LOSER_NOT_WORSE:
            break
    return (worse / counted if counted else 0.0), counted


def prior_score(comp, y: np.ndarray, pred: np.ndarray, whole: bool = False) -> tuple[float, np.ndarray] | None:
    """The metric of train.py's fallback on the OOF rows `y` and the fallback as OOF rows: the
    competition's own (`comp.fallback_oof(y, pred)`: segmentation's empty masks), else the training
    prior (class frequencies, each tag's share, or the mean (MAE: median), tiled like `pred`); None where the
    task's OOF is not one row of values a row, or the metric does not take a constant answer, or
    `pred` is one model's among others (a table's MLP: `whole`, the blend of them all, is judged)."""
    import numpy as np

    from .submission import prior_prediction

    if callable(own := getattr(comp, "fallback_oof", None)):
        rows = own(y, pred)
        return last_metric(comp)(y, rows), rows
    one_of_many = getattr(comp, "oof_names_model", False) and not whole
    if not getattr(comp, "oof_averages", True) or one_of_many or pred.ndim != 2:
        return None
    n_classes = pred.shape[1] if len(comp.classes) and y.ndim == 1 else 0
    try:
        prior = np.atleast_1d(prior_prediction(y, n_classes, getattr(comp, "metric_name", "").lower()))
        if prior.shape != (pred.shape[1],):
            return None
        tiled = np.tile(prior, (len(y), 1))
        return last_metric(comp)(y, tiled), tiled
    except (ValueError, TypeError, IndexError):  # a metric that a constant answer does not define
        return None


def read(out: Path) -> dict:
    """hand_in.json's sections; none without the file. One that does not read back (emptied or cut
    short after its atomic write: a full disk, a copy stopped midway) is no verdict either, said
    once per process (unreadable): the folds and every grown seed count until a train.py run
    judges them again and writes it."""
    path, text = Path(out) / FILE, None
    try:
        text = path.read_text()
        found = json.loads(text)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # a folder of its name; cut short, not UTF-8 (a ValueError)
        unreadable(str(path), "empty: 0 bytes" if text == "" else type(e).__name__)
        return {}
    if not isinstance(found, dict):
        unreadable(str(path), f"a JSON {type(found).__name__}, not train.py's sections")
        return {}
    return found


@functools.cache  # once per file and reason: predict.py reads it up to three times
def unreadable(path: str, why: str) -> None:
    print(
        f"WARNING: {path} does not read back ({why}): no hand-in verdict applies (the folds and every grown seed "
        f"count); a train.py run judges them again and writes it"
    )


def record(out: Path, section: str, verdict: dict | None) -> None:
    """One section of hand_in.json written (None: removed), the others kept."""
    found = read(out)
    if verdict is None and section not in found:
        return
    found.pop(section, None)
    if verdict is not None:
        found[section] = verdict
    text = json.dumps(found, indent=1)
    atomic_write(Path(out) / FILE, lambda tmp: Path(tmp).write_text(text))


def mtimes(paths) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(paths) if p.is_file()}


# what a "fallback" verdict judged: the checkpoints, and a table's trees by their fold test predictions (the blend's)
JUDGED = ("model_fold*.pth", "test_*_fold*.csv")


def judged(out: Path) -> dict[str, int]:
    """The files a "fallback" verdict judges (JUDGED) and their modification times."""
    return mtimes(p for pattern in JUDGED for p in Path(out).glob(pattern))


def still(out: Path, files) -> bool:
    """The files a verdict judged (`files`: name -> modification time) are all there, unchanged since."""
    return isinstance(files, dict) and bool(files) and files == mtimes(Path(out) / n for n in files)


def judge(comp, out: Path, y: np.ndarray, pred: np.ndarray, scores: dict, whole: bool = False) -> None:
    """The HAND-IN line and hand_in.json's "fallback" section, when the folds' OOF predictions
    lose to the training prior's on the same rows (the paired bootstrap). `whole`: `pred` is the
    submission's whole answer, a table's blend of its models (blend.judge)."""
    found = prior_score(comp, y, pred, whole) if scores else None
    if found is None:
        record(out, "fallback", None)
        return
    (prior, tiled), (name, value) = found, list(scores.items())[-1]
    share, n = worse_share(last_metric(comp), y, pred, tiled, comp.higher_is_better, decided=True)
    if share < CONFIDENCE:
        record(out, "fallback", None)
        return
    what = fallback_of(comp)
    print(
        f"HAND-IN: the fallback: the folds' OOF {name} {value:.4f} is worse than {owner(what)} {prior:.4f} on "
        f"the same {len(y)} rows (in {share:.0%} of {n} paired bootstrap resamples); "
        f"predict.py keeps train.py's fallback ({FILE})"
    )
    record(out, "fallback", {"metric": name, "oof": value, "prior": prior, "what": what, "checkpoints": judged(out)})


def fallback_of(comp) -> str:
    """What train.py's fallback holds, in words: the task's (tasks.py: the empty masks), by the
    competition's `describe`; the training prior where it names no task of the registry."""
    task = getattr(comp, "describe", {}).get("task")
    return tasks.BY_NAME[task].fallback if task in tasks.BY_NAME else tasks.PRIOR


def fallback_in(out: Path) -> str:
    """What train.py's fallback in `out` holds, in words, by serve_defaults.json's kind (kind_words;
    the training prior also when no file reads back)."""
    from .serving import read_defaults

    try:
        kind = read_defaults(out).get("kind")
    except RunError:  # none, or cut short: the words most runs' fallback has
        kind = None
    return kind_words(kind)


def kind_words(kind: str | None) -> str:
    """What a fallback of submission.fill's `kind` holds, in words: no mask or box for masks and
    boxes (submission.EMPTY_KINDS), else the training prior."""
    from .submission import EMPTY_KINDS  # it imports this module

    return "no mask or box" if kind in EMPTY_KINDS else tasks.PRIOR


def owner(what: str) -> str:
    """`what`'s, in words: the training prior's, the empty masks'."""
    return what + ("'" if what.endswith("s") else "'s")


def standing_fallback(out: Path) -> dict | None:
    """hand_in.json's "fallback" verdict (its metric, the folds' OOF score and the prior's) while
    it stands: the checkpoints it judged are there, unchanged since; else None."""
    found = read(out).get("fallback")
    if not isinstance(found, dict) or not {"checkpoints", "metric", "oof", "prior"} <= found.keys():
        return None
    files = found["checkpoints"]
    if not isinstance(files, dict) or not files or files != judged(out):
        return None
    return found


def check(out: Path, submission: str = "submission.csv") -> None:
    """predict.py's and serve.py's start: KeptFallback when the run that made the checkpoints
    there judged them worse than its fallback (the same checkpoints, unchanged since)."""
    found = standing_fallback(out)
    if found is None:
        return
    (name, value, prior), (what, than) = (found[k] for k in ("metric", "oof", "prior")), fallback_words(found)
    raise KeptFallback(
        f"SUBMISSION: {Path(out) / submission} kept: train.py's fallback ({what}), because the folds' "
        f"OOF {name} {value:.4f} is worse than {than} {prior:.4f} ({Path(out) / FILE}; delete it to hand in the folds)"
    )


def fallback_words(verdict: dict) -> tuple[str, str]:
    """(What the fallback a verdict kept holds, whose score it beat), in words: ("the training
    prior", "the prior's") (also a verdict written before the fallback was named), ("the empty
    masks", "the empty masks'")."""
    what = verdict.get("what")
    what = what if isinstance(what, str) and what else tasks.PRIOR
    return what, "the prior's" if what == tasks.PRIOR else owner(what)


def untrained(error: NothingTrained, in_run: bool, submission: str = "submission.csv") -> Exception:
    """What predict.py raises when it found no model (`error`). Started by run.py beside train.py
    (`in_run`: --after-train; run.py's go came after train.py ended, or run.py died and predict.py
    waited for train.py on its own) with this run's fallback in place (the submission written since
    this process started: train.py writes it after its preflight), that file is handed in:
    KeptFallback, exit 0, as when no fold finishes before the deadline; the lines above it say why
    train.py saved none (a budget that left no training time, a stop, an error). On its own, run.py
    killed, it said `run train.py first (nothing was written)` over the fallback train.py had written.
    Without run.py: run train.py first."""
    if not in_run:
        return error
    path = Path(error.out_dir) / submission
    try:
        ours = path.stat().st_mtime >= time.time() - process_age() - CLOCK_SLACK_S
    except OSError:
        ours = False
    if ours:
        return KeptFallback(
            f"SUBMISSION: {path} kept: train.py saved no model in this run, so its fallback is handed in "
            f"(the lines above say why: train.py's, run.py's)"
        )
    return RunError(
        f"no {error.what} in {error.out_dir} and no fallback of this run: the lines above say why (train.py's, run.py's)"
    )


def seeds_lose(comp, y: np.ndarray, first: np.ndarray, averaged: np.ndarray) -> tuple[float, int]:
    """(The share of resamples in which the grown seeds averaged in score worse than the first seed
    alone, the resamples counted)."""
    return worse_share(last_metric(comp), y, averaged, first, comp.higher_is_better)


def left_out(out: Path) -> set[str]:
    """The grown seeds' files (checkpoints, a booster's test files) a "seeds*" verdict left out,
    while they are unchanged."""
    names = set()
    for section, files in read(out).items():
        if section.startswith("seeds") and still(out, files):
            names |= set(files)
    return names


def is_left_out(name: str, lost: set[str]) -> bool:
    """Whether a run folder's file is one of `lost` (left_out's): a checkpoint by its own name, a
    booster's fold model (tree_lgbm_fold0_seed2.json and its library's file) by its test file's
    (test_lgbm_fold0_seed2.csv), the file a verdict names. `kagtpl kaggle` leaves these out."""
    return name in lost or f"test_{Path(name).stem.removeprefix('tree_')}.csv" in lost
