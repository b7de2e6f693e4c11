"""Growing a plan: when the planned folds are trained with time to spare, more seeds of the same
folds, their checkpoints ensembled with the first seed's (docs/time-budget.md, "Growth").

Pure rules, no torch: the engine (growing.grow_seeds) asks them before every fold it adds, with
the fold's measured time and the training time left; a fake clock drives them in the tests.
It is machinery: `copier update` may replace it, so keep your own code elsewhere.
"""

from __future__ import annotations

import math
from pathlib import Path

from .planner import fmt_s

FIT_FRACTION = 0.95  # a fold is added only when its measured time (and its prediction) fit 95% of what is left
MAX_SEEDS = 5  # the first seed and up to 4 more: past ~5 a seed ensemble's gain is under its noise
# Grown seeds train this many times the plan's epochs when validation was still improving late in
# the plan in at least half of its folds: the best val loss of its last third at least LATE_GAIN
# below the loss where that third began. Once, not compounded: seed 5 trains what seed 2 does.
# (The best epoch being the last was no evidence: on 600 digit images the loss fell 30% in the
# last third and then wobbled by 0.001, so 4 of 5 folds peaked at epoch 8 or 9 of 10.)
EPOCH_GROWTH, LATE_GAIN = 1.5, 0.10
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


def seeds_oof_name(k: int) -> str:
    """oof_fold{k}_seeds.csv: fold k's rows predicted by its seeds ensembled (seeds_oof.py: masks)."""
    return f"oof_fold{k}_seeds.csv"


def seeds_column(folds: list[int], counts) -> str:
    """The experiments table's seeds: '1', or '2 (+3 folds)' when 3 grown folds of seeds up to 2
    count (`counts(k, s)`: fold k of seed s is whole, and of this run's settings)."""
    grown = [s for s in range(2, MAX_SEEDS + 1) for k in folds if counts(k, s)]
    return f"{max(grown)} (+{len(grown)} folds)" if grown else "1"


def partial_oof_name(k: int, seed_no: int) -> str:
    """Where a grown seed's fold writes its OOF until the fold ends: a fold cut by the deadline or
    SIGTERM never counts ('*.csv' globs do not see it)."""
    return f"{oof_name(k, seed_no)}.part"


def why_not(args, planner, worker: bool = False) -> str | None:
    """Why this run does not grow at all (None: it may). Growth needs a budget, every fold of the
    plan trained (a plan the planner cut grows too: the cut keeps 20% slack, and the audio benchmark's
    cut plan ended with 20% of its training time left) and one process training every fold, or a
    process whose folds no other trains (`worker`: a fold worker, which grows the (seed, fold) units
    it claims; a table's boosters, which train in train.py's own process); not DDP."""
    if getattr(args, "no_grow", False):
        return "--no-grow"
    if not planner.budget:
        return "no --budget"
    if not getattr(args, "budget_given", True):
        return "no --budget given: the project's default is a limit, not time to fill (python run.py --budget 9h grows)"
    if args.dry_run:
        return "--dry-run"
    if getattr(args, "train_folds", 0) or getattr(args, "predict_reserve", -1) == 0:
        return "--train-folds or --predict-reserve 0 (tune.py's trials)"
    if args.parallel != "none" and not worker:  # a fold worker grows the units it claims; DDP does not
        return f"--parallel {args.parallel}"
    if planner.share < 1:  # a table's MLP before other models (--models mlp,...): their time is not spare
        return "models still to train after this one"
    if planner.stop_reason:
        return planner.stop_reason
    return None


def start(
    left: float, training_s: float, fold_s: float, predict_fold_s: float, fits: bool | None = None, took: str = ""
):
    """Whether to start growing, and the GROW line's reason: one more fold (with its share of
    prediction) fits the training time left; `fits` when the caller decided that (a shorter fold,
    growing.grown_epochs), `took` its price of a fold (the shortest allowed, where the measured one
    early-stopped: `a fold takes ~46s` beside `none` read as a fold that fitted). There is no least
    share: a 9-hour plan that leaves 10% spends 50 minutes."""
    share = max(0.0, left) / training_s if training_s > 0 else 0.0  # past the deadline: 0%, not -0%
    said = f"{fmt_s(max(0.0, left))} of {fmt_s(training_s)} training time left ({share:.0%})"
    if fold_s <= 0:  # every planned fold resumed from checkpoints that record no timing: nothing to price by
        return False, f"{said}, no fold timed (every planned fold resumed, none recorded its time)"
    fold = f"{took or f'a fold takes ~{fmt_s(fold_s)}'} (+{fmt_s(predict_fold_s)} to predict)"
    return fold_fits(left, fold_s, predict_fold_s) if fits is None else fits, f"{said}, {fold}"


def capped(left: float, who: str = "") -> str:
    """The line a growth that reached MAX_SEEDS of every fold ends with: the time it leaves is left
    by the rule, not by a stop (a run's RUN line at 0.56 of its budget said nothing of why)."""
    return (
        f"GROW: done{who}: every fold has its {MAX_SEEDS} seeds (the cap: past ~5 a seed ensemble's gain is "
        f"under its noise); {fmt_s(max(0.0, left))} training time left"
    )


def fold_fits(left: float, fold_s: float, predict_fold_s: float) -> bool:
    """One more fold fits: its measured time and its share of prediction, within FIT_FRACTION of what is left."""
    return fold_s + predict_fold_s <= FIT_FRACTION * left


def grown_epochs(target: int, left: float, fold: tuple[float, int], epoch_s: float, predict_fold_s: float, least: int):
    """The epochs of the next grown fold: `target` when that fits FIT_FRACTION of what is left,
    else the most that do (a shorter last fold), or 0 when that is under `least` (the engine's).
    Whole folds alone left up to a fold's time unused (0.82 of a 10-minute image budget, 26 s left
    before a 69 s fold); a seed shorter than the plan lowered its fold's OOF AUC when averaged in
    (a 13-epoch audio fold of a 20-epoch plan 0.953 -> 0.939; a 16-epoch one, --mixup 1.0, 0.957
    -> 0.938), so a seed is never shorter than the plan; a fold of the split given back, its fold's
    only model, is never shorter than the fewest epochs the plan gave a fold (Timings.shortest:
    its schedule, not where early stopping ended it; folds back as short as an early stop, 7 and
    11 epochs of a plan of 14-20, lowered a held-out dice 0.5026 -> 0.4746). `fold`: the
    measured fold growth sizes by (its seconds and its epochs); each epoch more or less costs
    `epoch_s`. Nothing timed (every fold resumed from checkpoints with no timing): 0."""
    fold_s, epochs = fold
    if fold_s <= 0:  # nothing timed: no fold is known to fit
        return 0
    if epoch_s <= 0:
        return target if fold_fits(left, fold_s, predict_fold_s) else 0
    fit = epochs + math.floor((FIT_FRACTION * left - predict_fold_s - fold_s) / epoch_s)
    n = min(target, fit)
    return n if n >= least else 0


def served_room(data_dir, room: int, model_bytes: int, models: int) -> str | None:
    """Why one more checkpoint is not grown for serve.py (None: it may be): a competition served
    through Kaggle's evaluation API (its data ships kaggle_evaluation/) gets an ensemble serve.py
    keeps loaded, within `room` bytes of the device (serving.HELD_SHARE of its memory): `models`
    checkpoints of `model_bytes` each, the next one included, must fit. A file-based competition's
    predict.py loads one checkpoint at a time (its weights memory-mapped): no cap."""
    if not room or not model_bytes or not (Path(data_dir) / "kaggle_evaluation").is_dir():
        return None
    if models * model_bytes <= room:
        return None
    return (
        f"serve.py keeps every checkpoint loaded: {models} of {model_bytes / 1e6:.0f} MB would pass the "
        f"{room / 1e6:.0f} MB the device has for them"
    )


DISK_MARGIN = 100 * 2**20  # beside a grown checkpoint and its temporary copy: its OOF rows, the submission, the logs


def disk_room(free: int, model_bytes: int) -> str | None:
    """Why one more checkpoint is not grown for the disk (None: it may be): the grown fold's
    checkpoint, the temporary copy each save writes beside it, and DISK_MARGIN must fit in the
    `free` bytes of the output folder's disk (Kaggle's working disk: 20 GB; 25 grown checkpoints of
    deberta-v3-base are ~18.5 GB). A grown fold that met a full disk stopped train.py with an ERROR
    when it saved, and the run ended as failed."""
    need = 2 * model_bytes + DISK_MARGIN
    if not model_bytes or free >= need:
        return None
    return (
        f"the disk has {free / 2**20:.0f} MB free there, a grown fold needs {need / 2**20:.0f} MB: its "
        f"{model_bytes / 2**20:.0f} MB checkpoint, the temporary copy each save writes, and "
        f"{DISK_MARGIN / 2**20:.0f} MB for its OOF rows and the submission"
    )


def fold_line(which: str, epochs: tuple[int, int, int], said: str, fold_s: float, left: float) -> str:
    """The GROW line before a grown fold. `epochs`: its own, the plan's and the target's. A fold
    of other epochs than the plan's, or fewer than the target (the last, only that fits), says
    so; its `said` names the measured fold (at that fold's epochs), not this one's time (on an H100
    `~7.0s of 6.9s training time left` read as a fold that did not fit)."""
    n, planned, target = epochs
    if n == planned == target:
        return f"GROW: {which}: ~{fmt_s(fold_s)} of {fmt_s(left)} training time left"
    short = f"; {target} do not fit" if n < target else ""
    return f"GROW: {which} in {n} epochs (the plan's {planned}{short}): {said}"


def back_line(k: int, folds: int, epochs: tuple[int, int, int], said: str, dead: int = 0) -> str:
    """The GROW line before a fold of the split given back: one a cut plan left out, or one whose
    fold worker (pid `dead`) died in it. `epochs`: its own, the plan's now and the fewest a fold was
    planned for; fewer than the plan's says so (the most that fit)."""
    n, planned, least = epochs
    fewer = f" in {n} epochs (the plan's {planned} do not fit; a fold of the plan had {least})" if n < planned else ""
    why = f"its worker, pid {dead}, died in it" if dead else f"the plan had cut it to {folds} folds"
    return f"GROW: fold {k} back ({why}){fewer}: {said}"


def late_start(planned: int) -> int:
    """The epoch after which the plan's last third begins: 7 of 10, 3 of 4, 2 of 3. A 2-epoch plan
    reads its last epoch (after epoch 1: a third would begin at the last and read nothing, so a
    text model's loss falling 23% in its second epoch grew seeds of 2 epochs); 0 for one epoch."""
    return min(math.ceil(2 * planned / 3), planned - 1)


def late_gain(curve: list[float], planned: int) -> float:
    """How much a fold's val loss (`curve`, one a validated epoch) fell in the last third of the
    `planned` epochs its schedule had: (the loss where it began - the best after) / the loss where
    it began; 0 for a fold that did not train every planned epoch (early-stopped or cut), and for
    a plan of one epoch."""
    start = late_start(planned)
    if len(curve) < planned or start < 1 or curve[start - 1] <= 0:
        return 0.0
    return (curve[start - 1] - min(curve[start:planned])) / curve[start - 1]


def epochs_target(planned: int, curves: list[tuple[list[float], int]]) -> tuple[int, str]:
    """The epochs grown seeds aim for, and why: EPOCH_GROWTH x `planned` (the plan's epochs now)
    when the planned folds' val loss was still falling by LATE_GAIN or more in the last third of
    their epochs in at least half of them, else `planned`. `curves`: each fold's val losses (an
    entry an epoch) and the epochs its schedule had, by which it is judged: a plan cut to 13 and
    given back 15 in fold 0 and 20 in fold 1 judged fold 0's 15 by the 20 and counted it against."""
    late = sum(1 for curve, own in curves if late_gain(curve, own) >= LATE_GAIN)
    if curves and 2 * late >= len(curves):
        more = math.ceil(EPOCH_GROWTH * planned)
        same = all(own == planned for _, own in curves)
        tail = f"after epoch {late_start(planned)}" if same else "in the last third of their epochs"
        return more, f"validation still improving {tail} in {late} of {len(curves)} folds: {more} epochs"
    return planned, ""


# A table's grown booster seed (tree_seeds.py) is also Kagglers' last step, a lower learning rate
# with more trees: seed s at the first's x 0.5^(s-1), never under a quarter
LR_STEP, LEAST_LR = 0.5, 0.25


def booster_lr_scale(seed_no: int) -> float:
    """Booster seed `seed_no`'s learning rate as a share of the first seed's: 1, 0.5, then 0.25.
    Its trees, patience and fit time grow by the inverse (early stopping decides how many are kept)."""
    return max(LEAST_LR, LR_STEP ** (seed_no - 1))


def booster_params(params: dict, seed_no: int) -> dict:
    """The boosters' settings for seed `seed_no`: its learning rate, and the trees and the early
    stopping's patience in proportion."""
    scale = booster_lr_scale(seed_no)
    more = {"rounds": math.ceil(params["rounds"] / scale), "early_stop": math.ceil(params["early_stop"] / scale)}
    return {**params, "lr": params["lr"] * scale, **more}


def booster_signature(sig: str, seed_no: int) -> str:
    """A grown booster seed's files are signed with the first seed's signature and its learning-rate
    share: its settings follow from both, and a seed grown by other rules is not averaged in (and is refit)."""
    return sig if seed_no == 1 else f"{sig}-lr{booster_lr_scale(seed_no):g}"
