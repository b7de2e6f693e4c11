"""The growth loop: what a run adds once its planned folds are trained with time to spare, one
fold at a time (engine.cross_validate calls `grow`): the folds a cut plan left out, TTA views,
then more seeds of the same folds. growth.py holds the rules it asks before each fold, timings.py
the measures they read. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from . import artifacts, growth, seeds_oof, serving, storage, tta_views
from .fold import train_fold
from .gpu import device_memory, seed_everything
from .planner import fmt_s

if TYPE_CHECKING:  # runs.py builds the run
    from .runs import Run


def grow(comp, splits: list, trained: list[int], run: Run, queue=None, seeds: bool = True) -> list[int]:
    """The plan's folds are trained with time to spare: first the folds a cut plan left out (each
    while it fits), then TTA views, then the same folds again from other seeds (growth.py's
    rules), each fold added only when it and its prediction fit; a GROW line says each step and
    why. A fold cut by the deadline or SIGTERM is never ensembled (growth.partial_oof_name).
    `seeds` False leaves the seeds for later (`run.seeds_left`; engine.more_seeds grows them): a
    table's MLP, whose seeds wait for the boosters the blend weighs more (tree_seeds.seed_order).
    A fold worker (`queue`) claims the folds given back and the seeds' folds as it claimed the
    plan's (Kaggle's T4x2 had grown nothing, and most of 9 hours went unused); the first worker
    past the split chooses the TTA views, on the folds complete by then (views_on_workers).
    Returns the folds trained (the plan's, and those given back)."""
    planner = run.planner
    why = growth.why_not(run.args, planner, worker=queue is not None)
    if why:
        print(f"GROW: none ({why})")
        return trained
    if growth_fold_s(planner) <= 0:
        print("GROW: none (nothing timed: every planned fold was resumed from checkpoints that record no timing)")
        return trained
    if not folds_back(comp, splits, trained, run, queue):  # a fold of the split does not fit: nor does a seed's
        return trained  # (past it, every fold of the split is trained, or taken by a worker)
    if queue is not None:  # predict.py ensembles every fold of the split: the reserve counts them
        planner.fold_back(len(splits) - 1)
        views_on_workers(comp, splits, run, queue)
    else:
        tta_views.grow(comp, splits, run)  # first: the seeds' fit checks count the views' price
    if seeds:
        grow_seeds(comp, splits, run, queue)
    else:
        run.seeds_left = True
    return trained


def views_on_workers(comp, splits: list, run: Run, queue) -> None:
    """Fold workers' TTA views: the first worker past the split (every fold trained or taken)
    chooses them once, on the folds complete by then (a fold another worker is still training is
    left out of the evidence), and leaves the factor in the queue; every worker's reserve reads it
    before each unit it grows (grow_seeds). Kaggle's T4x2 runs image projects on fold workers by
    default: predict.py averaged the plan's views whatever the OOF rows said."""
    if not tta_views.growable(comp) or not queue.take_views():
        return  # no views to choose (nor checkpoints to read for it), or another worker chooses them
    complete = [k for k in range(len(splits)) if finished(comp, run, k)]
    queue.set_view_factor(tta_views.grow(comp, splits, run, complete))


def folds_back(comp, splits: list, trained: list[int], run: Run, queue=None) -> bool:
    """The folds of the split a cut plan left out, trained before any seed grows, each while it and
    its share of prediction fit (a loaded 2-core machine cut a table's plan 5->3 and its MLP spent
    61% of the training time on seeds while folds 3 and 4 were never trained: the blend was fitted
    on 720 of 1,200 rows); at the plan's epochs, or the most that fit down to the fewest the plan
    gave a fold (Timings.shortest: epochs given back in fold 1 raised a plan of 15 to 20, and fold
    2 at 15 was not tried; a segmentation run left 35% of its budget). A fold worker (`queue`)
    claims each as it claimed the plan's folds (Kaggle's T4x2 grew the seeds of a plan cut 5->3,
    and folds 3 and 4 were never trained), and first takes again, once, a fold whose worker died
    in it (the OOM killer: the other worker grew seeds to the budget's end, and the fold was lost).
    A fold's fit is checked with the reserve counting every fold before it, a worker's too: two
    detection workers with a plan cut to 1 fold checked folds 2 and 3 against a reserve for 1, the
    reserve then jumped to 4 folds (36 s -> 111 s), one worker stopped at once and the other's
    fold was cut by the deadline inside its first epoch, both wasted.
    Adds each fold it trains to `trained`; returns whether growth may go on (not: a stop, or a fold
    of the split that does not fit)."""
    planner = run.planner
    for k in range(len(splits)):
        dead = queue.orphan(k) if queue is not None else 0  # the pid of its worker, dead since
        if k in trained or (queue is not None and queue.claimed(k) and not dead):
            continue  # this process's, or a living worker's
        if k > planner.folds:  # every fold before k is trained or taken: predict.py ensembles them all
            planner.fold_back(k - 1)  # so the reserve counts them before fold k's fit is checked
        done = finished(comp, run, k)  # complete: an earlier run gave it back, or its worker died after it
        least = planner.times.shortest(planner.epochs)
        epochs, said = grown_epochs(planner, planner.epochs, least)
        if not done and (planner.stop_reason or not epochs):
            print(f"GROW: stop before fold {k} of the split ({planner.stop_reason or said}): no seeds either")
            return False
        if queue is not None and not (queue.retake(k) if dead else queue.take(k)):
            continue  # another worker took it meanwhile
        # the plan's folds before this one is added
        line = growth.back_line(k, planner.folds, (epochs, planner.epochs, least), said, dead)
        if k >= planner.folds:  # predict.py ensembles it: the reserve counts it
            planner.fold_back(k)
        trained.append(k)
        if done:
            if not dead:  # a dead worker's complete fold: claimed, so train.py does not count it lost
                resumed(run, k, done)
            continue
        print(line)
        trn_idx, val_idx = splits[k]
        print(f"FOLD {k} ({k + 1} of {len(splits)}): {len(trn_idx)} train, {len(val_idx)} valid")
        planner.times.begin_fold(k)
        fold = comp.fold(k, trn_idx, val_idx)
        with planner.grown_fold(epochs):
            best = train_fold(comp, fold, len(trn_idx), run, False)
            planner.end_fold(k, False, fold.val_losses)  # recorded as planned for its own epochs
        if queue is not None:  # every worker's evidence for more epochs (grow_seeds)
            queue.add_curve(k, fold.val_losses, epochs)
        print(f"FOLD {k} DONE: best val loss {best:.4f}, {planner.elapsed():.0f}s elapsed")
        if planner.stop_reason:
            return False
    return True


def finished(comp, run: Run, k: int) -> dict | None:
    """Fold `k`'s checkpoint in --out-dir when it is complete and of this run's settings (resume), else None."""
    config = artifacts.checkpoint_config(run.args, run.machine, run.batching)
    return storage.finished_fold(Path(run.args.out_dir) / f"model_fold{k}.pth", config, artifacts.run_keys(comp))


def resumed(run: Run, k: int, done: dict) -> None:
    """Fold `k` is skipped, complete (`done`: its checkpoint): its recorded timing stands for this
    process's measure (growth prices what it adds by it)."""
    print(f"FOLD {k}: model_fold{k}.pth is complete, skipping (resume)")
    run.planner.resumed_fold(done.get("timing"))


def grow_seeds(comp, splits: list, run: Run, queue=None) -> bool:
    """The same folds again from other seeds, each fold added only when it and its prediction fit;
    a fold worker (`queue`) takes the (seed, fold) units no other worker has. Returns whether it
    started (a seed's fold fitted the time left when it began)."""
    planner = run.planner
    if seeds_oof.judged(comp):  # masks: each grown seed's judging pass at train.py's end, held from training
        planner.prediction.judge_grown(seeds_oof.rows_share(comp, splits))
    curves = queue.curves() if queue is not None else planner.times.val_curves  # a worker's: every worker's
    if queue is not None:  # the views another worker chose: the fit checks below price them
        planner.prediction.set_view_factor(queue.view_factor())
    target, more = growth.epochs_target(planner.epochs, curves)
    epochs = grown_epochs(planner, target)[0]  # a shorter fold counts
    left, fold_s, predict_s = planner.training_left(), growth_fold_s(planner), planner.prediction.fold_s
    took = fold_price(planner, planner.epochs, epochs)  # `none`: the shortest fold allowed, priced
    ok, said = growth.start(left, planner.training_time(), fold_s, predict_s, epochs > 0, took)
    print(f"GROW: {'more seeds' if ok else 'none'}: {said}{'; ' + more if ok and more else ''}")
    for seed_no in range(2, growth.MAX_SEEDS + 1 if ok else 2):
        for k, (trn_idx, val_idx) in enumerate(splits):
            if queue is not None and not folds_back(comp, splits, [], run, queue):
                return ok  # a fold whose worker died since does not fit, nor does a seed's (or a stop)
            if queue is not None and not queue.take(k, seed_no):
                continue  # another worker has it
            if queue is not None:  # every worker's grown folds and views: predict.py's work (the reserve)
                planner.prediction.set_grown(queue.grown() - 1)
                planner.prediction.set_view_factor(queue.view_factor())
            if not grow_fold(comp, (k, trn_idx, val_idx), seed_no, run, target):
                return ok
    if ok and queue is None:  # a fold worker's units end where the other workers' go on
        print(growth.capped(planner.training_left()))
    return ok


def growth_fold(planner) -> tuple[float, int]:
    """The fold growth's rules size by, as (seconds, epochs): the slowest measured fold after the
    first (which carries the probe and the warm-up), else the first; (0, 0) when this process
    trained none (all resumed)."""
    timed = list(zip(planner.times.fold_s, planner.times.fold_epochs, strict=True))
    return max(timed[1:] or timed or [(0.0, 0)])


def growth_fold_s(planner) -> float:
    return growth_fold(planner)[0]


def grown_epochs(planner, target: int, least: int | None = None) -> tuple[int, str]:
    """The epochs of the next grown fold, and why: `target` (growth.epochs_target) when that fits
    the training time left, fewer when only a shorter fold does, but not fewer than `least` (by
    default the plan's epochs: a seed averaged into its fold), 0 when none does (growth.grown_epochs).
    The why names the measured fold, or, when none fits, the shortest fold allowed: `a fold takes
    ~46s, 106s training time left` read as a fold that fitted, where the 46 s fold had early-stopped
    at epoch 8 and one of the plan's 20 epochs needed ~113 s."""
    fold, left = growth_fold(planner), planner.training_left()
    least = planner.epochs if least is None else least
    epochs = growth.grown_epochs(target, left, fold, epoch_median(planner), planner.prediction.fold_s, least)
    return epochs, f"{fold_price(planner, least, epochs)}, {fmt_s(max(0.0, left))} training time left"


def epoch_median(planner) -> float:
    return statistics.median(planner.times.epoch_s) if planner.times.epoch_s else 0.0


def fold_price(planner, least: int, epochs: int) -> str:
    """What a grown fold costs, as GROW lines say it: the measured fold, or, when no fold fits
    (`epochs` 0) and the measured one early-stopped under `least` epochs, the shortest allowed."""
    fold, epoch_s = growth_fold(planner), epoch_median(planner)
    if not epochs and epoch_s > 0 and 0 < fold[1] < least:  # the measured fold stopped early: price the shortest
        need = fold[0] + (least - fold[1]) * epoch_s
        return f"a fold of {least} epochs takes ~{fmt_s(need)} ({fmt_s(fold[0])} measured for {fold[1]})"
    return f"a fold takes ~{fmt_s(fold[0])}"


def served_room(run: Run) -> str | None:
    """growth.served_room for this run: its device's room for serve.py's folds, its first fold's
    checkpoint as the size of each, the plan's folds and the grown ones with the next."""
    args, planner = run.args, run.planner
    room = int(serving.HELD_SHARE * device_memory(run.machine.device))
    models = planner.folds + planner.prediction.extra_models + 1
    return growth.served_room(args.data_dir, room, checkpoint_bytes(run), models)


def disk_room(run: Run) -> str | None:
    """growth.disk_room for this run: the output folder's free disk, its first fold's checkpoint as
    the size of the next."""
    return growth.disk_room(shutil.disk_usage(run.args.out_dir).free, checkpoint_bytes(run))


def checkpoint_bytes(run: Run) -> int:
    """The size of a checkpoint of this run, growth's measure of the next: its first fold's (0: none yet)."""
    first = Path(run.args.out_dir) / "model_fold0.pth"
    return first.stat().st_size if first.is_file() else 0


def grow_fold(comp, split: tuple, seed_no: int, run: Run, target: int) -> bool:
    """One grown seed's fold of `target` epochs (or fewer, the last, to fit): skipped when complete
    (resume), else trained if it fits. Returns whether growth goes on."""
    (k, trn_idx, val_idx), args, planner = split, run.args, run.planner
    out, config = Path(args.out_dir), artifacts.checkpoint_config(args, run.machine, run.batching)
    name = growth.checkpoint_name(k, seed_no)
    if storage.fold_is_done(out / name, config, artifacts.run_keys(comp)):
        print(f"GROW: seed {seed_no} fold {k}: {name} is complete, skipping (resume)")
        planner.prediction.add_model()  # predict.py ensembles it all the same: the reserve counts it
        return True
    epochs, said = grown_epochs(planner, target)
    held = served_room(run) or disk_room(run)
    if planner.stop_reason or not epochs or held:
        print(f"GROW: stop before seed {seed_no} fold {k} ({planner.stop_reason or held or said})")
        return False
    seed, planned = growth.seed_value(args.seed, seed_no), planner.epochs
    fold_s, left = growth_fold_s(planner), planner.training_left()
    print(growth.fold_line(f"seed {seed_no} fold {k} (seed {seed})", (epochs, planned, target), said, fold_s, left))
    seed_everything(seed)
    planner.times.begin_fold(k)
    fold = comp.fold(k, trn_idx, val_idx)
    fold.seed_no = seed_no
    with planner.grown_fold(epochs):
        best = train_fold(comp, fold, len(trn_idx), run, False)
        planner.end_fold(k, False)  # recorded as planned for its own epochs
    if planner.stop_reason:
        print(f"GROW: seed {seed_no} fold {k} cut ({planner.stop_reason}): not ensembled")
        return False
    planner.prediction.add_model()
    print(f"GROW: seed {seed_no} fold {k} DONE: best val loss {best:.4f}, {planner.elapsed():.0f}s elapsed")
    return True
