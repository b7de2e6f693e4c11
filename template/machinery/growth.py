"""Growing a plan that fits: when the planned folds are trained with time to spare, more seeds of
the same folds, their checkpoints ensembled with the first seed's (docs/time-budget.md, "Growth").

Pure rules, no torch: the engine (engine.grow_seeds) asks them before every fold it adds, with
the fold's measured time and the training time left; a fake clock drives them in the tests.
It is machinery: `copier update` may replace it, so keep your own code elsewhere.
"""

from __future__ import annotations

from .planner import fmt_s

SPARE_FRACTION = 0.25  # grow only when more than 25% of the training budget is left after the plan
FIT_FRACTION = 0.95  # a fold is added only when its measured time (and its prediction) fit 95% of what is left
MAX_SEEDS = 5  # the first seed and up to 4 more: past ~5 a seed ensemble's gain is under its noise
SEED_STEP = 1000  # seed s trains with --seed + 1000 x (s - 1): another initialisation and augmentation order


def seed_value(base: int, seed_no: int) -> int:
    return base + SEED_STEP * (seed_no - 1)


def seed_tail(seed_no: int) -> str:
    """What a grown seed's file names add after `fold{k}`: nothing for the first seed (its names are
    as before growth), `_seed{s}` after it."""
    return "" if seed_no == 1 else f"_seed{seed_no}"


def checkpoint_name(k: int, seed_no: int = 1) -> str:
    """model_fold{k}.pth for the first seed, model_fold{k}_seed{s}.pth after it."""
    return f"model_fold{k}{seed_tail(seed_no)}.pth"


def oof_name(k: int, seed_no: int = 1) -> str:
    """oof_fold{k}.csv; a grown seed's OOF file is oof_fold{k}_seed{s}.csv once its fold is whole."""
    return f"oof_fold{k}{seed_tail(seed_no)}.csv"


def partial_oof_name(k: int, seed_no: int) -> str:
    """Where a grown seed's fold writes its OOF until the fold ends: a fold cut by the deadline or
    SIGTERM never counts ('*.csv' globs do not see it)."""
    return f"{oof_name(k, seed_no)}.part"


def why_not(args, planner) -> str | None:
    """Why this run does not grow at all (None: it may). Growth needs a budget, a whole plan (a
    plan that was cut has no time to spare) and one process training every fold."""
    if getattr(args, "no_grow", False):
        return "--no-grow"
    if not planner.budget:
        return "no --budget"
    if args.dry_run:
        return "--dry-run"
    if getattr(args, "train_folds", 0) or getattr(args, "predict_reserve", -1) == 0:
        return "--train-folds or --predict-reserve 0 (tune.py's trials)"
    if args.parallel != "none":
        return f"--parallel {args.parallel}"
    if planner.share < 1:  # a table's MLP before other models (--models mlp,...): their time is not spare
        return "models still to train after this one"
    if planner.stop_reason:
        return planner.stop_reason
    if planner.folds < planner.planned_folds or planner.epochs < planner.planned_epochs:
        return f"the plan was cut to folds={planner.folds} epochs={planner.epochs}"
    return None


def start(left: float, training_s: float, fold_s: float, predict_fold_s: float) -> tuple[bool, str]:
    """Whether to start growing, and the GROW line's reason: more than SPARE_FRACTION of the
    training budget left, and one more fold (with its share of prediction) fits."""
    share = left / training_s if training_s > 0 else 0.0
    said = f"{fmt_s(max(0.0, left))} of {fmt_s(training_s)} training time left ({share:.0%})"
    if share <= SPARE_FRACTION:
        return False, f"{said}, not more than {SPARE_FRACTION:.0%}"
    if fold_s <= 0:  # every planned fold was resumed: nothing timed in this process
        return True, f"{said}, a fold not timed yet (every fold resumed): the deadline guard cuts a fold that overruns"
    fold = f"a fold takes ~{fmt_s(fold_s)} (+{fmt_s(predict_fold_s)} to predict)"
    return fold_fits(left, fold_s, predict_fold_s), f"{said}, {fold}"


def fold_fits(left: float, fold_s: float, predict_fold_s: float) -> bool:
    """One more fold fits: its measured time and its share of prediction, within FIT_FRACTION of what is left."""
    return fold_s + predict_fold_s <= FIT_FRACTION * left
