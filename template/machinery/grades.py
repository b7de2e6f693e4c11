"""QWK's whole grades (APTOS's retinopathy 0-4, a wine's quality 3-8, PetFinder's adoption speed,
Prudential's risk 1-8): the quadratic weighted kappa they are scored by, and where a score's
predictions are cut into grades. A regression pulls its predictions toward the mean, so rounding
at the halves hands in too few of the outer grades; Kagglers cut where the OOF rows score the best
kappa (the "OptimizedRounder"), and so does predict.py: `with_cuts` chooses the cuts (a CUTS line),
submission.fill hands in `whole(values, config)`. Machinery: `copier update` may replace it.
"""

from __future__ import annotations

import numpy as np

MAX_GRADES = 30  # more whole values than this is a score, not grades: rounded, no cut chosen
STEPS, PASSES = 41, 3  # each cut tried at STEPS points between its neighbours, every cut in turn, PASSES times


def quadratic_kappa(y: np.ndarray, grades: np.ndarray) -> float:
    """Cohen's kappa with quadratic weights of whole grades against whole labels (scikit-learn's
    cohen_kappa_score(weights="quadratic"), counted with one bincount). 0 where every row has one
    label and one grade."""
    y, grades = np.rint(y).astype(np.int64).ravel(), np.rint(grades).astype(np.int64).ravel()
    if not len(y):
        return 0.0
    low, k = min(y.min(), grades.min()), int(max(y.max(), grades.max()) - min(y.min(), grades.min()) + 1)
    return kappa_of(np.bincount((y - low) * k + (grades - low), minlength=k * k).reshape(k, k))


def kappa_of(observed: np.ndarray) -> float:
    """Quadratic weighted kappa of a confusion matrix: observed[label, grade], both counted up from
    one grade (rows or columns of zeros at either end change nothing)."""
    observed = np.asarray(observed, np.float64)
    weights = (np.arange(len(observed))[:, None] - np.arange(len(observed))[None, :]) ** 2
    expected = np.outer(observed.sum(1), observed.sum(0)) / max(observed.sum(), 1.0)
    chance = (weights * expected).sum()
    return float(1.0 - (weights * observed).sum() / chance) if chance else 0.0


def cut(values: np.ndarray, cuts, low: float) -> np.ndarray:
    """One target's predictions as whole grades: `low`, plus one for each cut a value reaches."""
    return low + (np.asarray(values, np.float64).reshape(-1, 1) >= np.asarray(cuts, np.float64)).sum(1)


def qwk_cuts(y: np.ndarray, pred: np.ndarray, low: int, high: int) -> tuple[list[float], float, float]:
    """The cuts between the grades low..high of one target's predictions that score the best QWK on
    these rows (coordinate descent from the halves; a cut moves only where the kappa rises), that
    kappa, and the kappa of rounding at the halves."""
    y, pred = np.clip(np.rint(y), low, high).astype(np.int64) - low, np.asarray(pred, np.float64).ravel()
    confusion = CutConfusion(y, pred, high - low + 1)
    cuts = np.arange(low, high, dtype=np.float64) + 0.5
    at_halves = best = kappa_of(confusion(cuts))
    least, most = np.nanmin(pred, initial=np.inf), np.nanmax(pred, initial=-np.inf)  # NaN: no cut there
    for _ in range(PASSES):
        for j in range(len(cuts)):
            below = cuts[j - 1] if j else min(least, cuts[j] - 1)
            above = cuts[j + 1] if j + 1 < len(cuts) else max(most, cuts[j] + 1)
            for c in np.linspace(below, above, STEPS)[1:-1]:
                trial = np.concatenate([cuts[:j], [c], cuts[j + 1 :]])
                kappa = kappa_of(confusion(trial))
                if kappa > best + 1e-12:
                    best, cuts = kappa, trial
    return [round(float(c), 4) for c in cuts], best, at_halves


class CutConfusion:
    """The confusion matrix of one target's grades (0..k-1) against its predictions cut at sorted
    cuts, as `cut` grades them (a value reaching a cut is above it), counted without a pass over the
    rows: each grade's predictions are sorted once, and a cut finds how many lie below it by binary
    search. The search's ~1,000 matrices then cost little more for 200,000 rows than for 2,000 (10
    grades: 9.3 s with a pass over the rows for each, 0.07 s so: docs/tabular.md)."""

    def __init__(self, y: np.ndarray, pred: np.ndarray, k: int):
        pred = np.where(np.isnan(pred), -np.inf, pred)  # `cut` grades a NaN lowest: it reaches no cut
        self.by_grade = [np.sort(pred[y == g]) for g in range(k)]

    def __call__(self, cuts: np.ndarray) -> np.ndarray:
        below = [np.concatenate([[0], np.searchsorted(s, cuts, side="left"), [len(s)]]) for s in self.by_grade]
        return np.diff(np.array(below), axis=1)  # [label, grade]: the rows between two cuts


def bounds(config: dict, targets: int) -> tuple[np.ndarray, np.ndarray]:
    """Each target's least and greatest training grade (config's target_range: a table's and a
    text's [[lows], [highs]], an image's [low, high]); unbounded without one."""
    given = config.get("target_range") or [[-np.inf], [np.inf]]
    low, high = np.asarray(given, np.float64).reshape(2, -1)
    return np.broadcast_to(low, (targets,)), np.broadcast_to(high, (targets,))


def whole(values: np.ndarray, config: dict) -> np.ndarray:
    """QWK's submission (a float one failed Kaggle's kappa scorer): each target's predictions cut
    where the OOF rows said (config's `cuts`, with_cuts), else rounded at the halves, clipped into
    the training grades' range, as int64."""
    values = np.asarray(values, np.float64).reshape(len(values), -1)
    low, high = bounds(config, values.shape[1])
    cuts = config.get("cuts")
    if cuts and len(cuts) == values.shape[1]:
        values = np.column_stack([cut(values[:, j], c, low[j]) for j, c in enumerate(cuts)])
    return np.clip(np.rint(values), low, high).astype(np.int64)


def with_cuts(config: dict, y: np.ndarray | None, pred: np.ndarray | None) -> dict:
    """config with the cuts chosen on these OOF rows (y: the grades, pred: the predictions, one
    column a target) under --metric qwk, a CUTS line for each target, and the grades they were chosen
    in as its target_range where it had none; as it is under another metric, without OOF rows, or
    where a target has more than MAX_GRADES grades (a score: rounded)."""
    if config.get("metric") != "qwk" or y is None or pred is None or not len(y):
        return config
    y, pred = np.asarray(y, np.float64).reshape(len(y), -1), np.asarray(pred, np.float64).reshape(len(y), -1)
    low, high = bounds(config, y.shape[1])
    ranges = [
        (int(np.rint(lo if np.isfinite(lo) else y[:, j].min())), int(np.rint(hi if np.isfinite(hi) else y[:, j].max())))
        for j, (lo, hi) in enumerate(zip(low, high, strict=True))
    ]
    if not all(2 <= hi - lo + 1 <= MAX_GRADES for lo, hi in ranges):  # before any CUTS line: none is used then
        return config
    names = [t for t in str(config.get("target") or config.get("label_col") or "").split(",") if t]  # an image's
    chosen = []
    for j, (lo, hi) in enumerate(ranges):
        cuts, best, at_halves = qwk_cuts(y[:, j], pred[:, j], lo, hi)
        name = names[j] if len(names) == y.shape[1] else f"target {j}"
        print(
            f"CUTS: {name}'s grades {lo}-{hi} cut at [{', '.join(f'{c:.2f}' for c in cuts)}]: OOF QWK {best:.4f} "
            f"over {len(y)} rows, chosen on them (rounded at the halves: {at_halves:.4f})"
        )
        chosen.append(cuts)
    # the grades the cuts were chosen in: a checkpoint of an earlier kagtpl has no target_range, and `whole`
    # would count its grades up from -inf
    found = [[float(lo) for lo, _ in ranges], [float(hi) for _, hi in ranges]]
    return {**config, "cuts": chosen, "target_range": config.get("target_range") or found}


def oof_cuts(config: dict, out) -> dict:
    """with_cuts on this run's oof.csv (artifacts.oof_rows): an image's, whose submission is the folds'
    mean (a text's: metrics.oof_threshold; a table's blend: blend.decided). Without it (missing, cut
    short, another run's) the predictions are rounded."""
    if config.get("metric") != "qwk":
        return config
    from .artifacts import oof_rows  # torch: predict.py has it imported by now

    return with_cuts(config, *oof_rows(out, config.get("signature", "")))
