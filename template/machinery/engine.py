"""kagtpl's cross-validation engine: the fold loop, the epoch loop and everything around them.

train.py holds the competition (data, model, loss, metric, prediction) and hands it to
`cross_validate`, which owns the rest, once for every task: resume, the time planner with its
deadline guard and SIGTERM, AMP, gradient accumulation, OOM micro-batching, the batch probe,
early stopping, atomic checkpoints, OOF files, the JSON log, the report picture, the
experiments table and every log line. It is machinery: `copier update` improves it, so keep
your code in train.py and predict.py and updates merge without conflicts.

The competition is a plain object (train.py's `Competition`) with:

    name: str               model name for the Model: line, the report and the experiments table
    classes: list           saved in every checkpoint; predict.py orders its columns by it
    id_col: str             the id column of the OOF files
    oof_columns: list[str]  one name per prediction column in the OOF files
    metric_name: str        the epoch line's label for the metric ("Acc", "AUC")
    higher_is_better: bool  for that metric (the experiments table ranks by it)
    resume_keys: tuple      config keys a finished fold's checkpoint must share to be skipped
    describe: dict          task and input for the experiments table ({"task": "image", "input": "224px"})
    test_rows, test_views, decode_s: float, int, float
                            prediction's work for the reserve: test rows in validation rows (audio: a
                            window is a third of a 3-window clip), views, seconds per row to prepare
    fold(k, trn_idx, val_idx) -> Fold        the fold's rows, with anything fitted on the training part
    loader(rows, batch, train) -> batches    a sized iterable of batches (tuples of tensors)
    build_model(fold) -> torch.nn.Module
    batch_loss(model, batch) -> (mean loss, rows)  the batch is on the device; runs under autocast
    predict(model, batch) -> Tensor (rows, columns) probabilities or values, one column per oof_columns
    val_loss(y, pred) -> float               lower is better: early stopping and the best checkpoint
    score(y, pred) -> dict[str, float]       the figures the OOF line prints; the last is the metric
    param_groups(model) -> list[dict]        optional: parameter groups, each with an `lr_scale`
                                             (text: layer-wise LR decay and a head LR)
    oof_names_model: bool                    optional: the OOF line ends with ({name}) (a table's
                                             MLP, beside its boosters' lines)
    oof_averages: bool                       optional, True: grown seeds' OOF predictions average
                                             into oof.csv (False: boxes, mask statistics)
    fallback_oof(y, pred) -> array           optional: train.py's fallback as OOF rows like `pred`, which
                                             the folds must beat (hand_in.py; default: the training
                                             prior); `fallback_name` says what it holds (the empty masks)
    predict_setup_s(model) -> float          optional: predict.py's seconds a fold beyond building
                                             it, for the reserve under a budget (audio: the export)
    tta_views: list[str]                     optional: every view predict.py may average, the plan's
                                             first test_views of them (image: image, hflip, zoom, ...)
    predict_view(model, batch, view) -> Tensor  with tta_views: predict() on one view; growth adds
                                             views when they lower the OOF val loss (tta_views.py)
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import artifacts, experiments, growth, logs, parallel, serving, storage, tta_views, workers
from .artifacts import copy_oof, fallback_submission, fixed_folds, read_targets, target_columns
from .errors import RunError
from .fold import Fold, dry_run_rows, train_fold, watchers_started, watchers_stopped, watching
from .gpu import describe_gpu, device_memory, seed_everything
from .machine import (
    Batching,
    Machine,
    batch_set_by_user,
    fit_steps,
    inference_machine,
    make_machine,
    make_planner,
    print_start,
    profile,
)
from .planner import fmt_s
from .runflags import (
    FLAG_RANGES,
    Given,
    add_batch_flags,
    add_run_flags,
    add_schedule_flags,
    begin,
    check_flags,
    check_folds,
    parse_args,
    parser,
)
from .steps import TensorBatches, predict

if TYPE_CHECKING:  # runs.py builds the run and imports this module
    from .runs import Run

# The names train.py and predict.py call as engine.<name>; each lives in the module imported from.
__all__ = [
    "FLAG_RANGES",
    "Batching",
    "Fold",
    "Machine",
    "TensorBatches",
    "Given",
    "add_batch_flags",
    "add_run_flags",
    "add_schedule_flags",
    "batch_set_by_user",
    "begin",
    "check_flags",
    "check_folds",
    "copy_oof",
    "cross_validate",
    "fallback_submission",
    "fit_steps",
    "fixed_folds",
    "inference_machine",
    "make_machine",
    "make_planner",
    "parse_args",
    "parser",
    "predict",
    "print_start",
    "profile",
    "read_targets",
    "target_columns",
    "watching",
]


# ----------------------------------------------------------------------------- cross-validation


def cross_validate(comp, splits, run: Run) -> dict:
    """Train every fold the plan allows, then score the OOF predictions. Returns the OOF scores.

    `splits` is an iterable of (train indices, validation indices), e.g. StratifiedKFold's.
    `run` (runs.Run) is the run by name: its flags (`run.args`: out_dir, epochs, patience, weight_decay,
    compile, autoscale (CUDA only), dry_run, parallel and the config saved with each checkpoint), the
    machine, the batching and the time planner; the JSON log is opened here, as `run.jlog`.
    With --parallel folds this process starts one worker per device (parallel.py), which train
    the folds; it then scores them and writes the report, as a sequential run does.
    """
    args, planner = run.args, run.planner
    out, splits = Path(args.out_dir), list(splits)  # growth.py's seeds go over the same splits again
    run_id = os.environ.get(parallel.RUN_ID_ENV) or experiments.run_id()
    # rank 0 alone writes the JSON log (the other ranks keep their records in memory)
    run.jlog = logs.JsonLog(out / "train_log.jsonl" if parallel.writes() else None, run_id, bool(args.dry_run))
    watchers_started(args)
    worker, lost = parallel.fold_worker(), []
    if worker is None and parallel.writes():  # predict.py's views are this run's choice (growth's) or the plan's,
        tta_views.forget(out)  # never an earlier run's: a run killed before growth predicts with the plan's
    # the experiments row: written now (running), rewritten at the end, or with the error that ended the run
    row = experiment_row(comp, run, run_id)
    with experiments.recording(out / "experiments.csv", row, planner.elapsed, parallel.writes() and worker is None):
        if args.parallel == "folds" and worker is None:
            trained, lost = train_on_workers(comp, run, run_id)
            run.jlog.records = logs.read_records(run.jlog.path, run_id)
        else:
            trained = train_folds(comp, splits, run)
            queue = workers.FoldQueue(out / ".folds") if worker else None  # a fold worker grows claimed units
            if worker or parallel.writes():
                trained = grow(comp, splits, trained, run, queue)
    if worker or not parallel.writes():  # the parent train.py (or rank 0) scores and reports
        if worker and planner.stop_reason:
            print(logs.stopped_line(planner.stop_reason))
        parallel.finish_ddp()
        return {}
    scores = finish(comp, run, trained, row)
    watchers_stopped(planner.stop_reason)
    parallel.finish_ddp()
    if lost:
        raise RunError("; ".join(lost) + ": rerun the command to train the lost fold(s) (finished ones are skipped)")
    return scores


def train_folds(comp, splits, run: Run) -> list[int]:
    """The fold loop of one process. A fold worker takes only the folds no other worker has
    (parallel.FoldQueue) and keeps the plan's fold count shared; under DDP every rank runs
    every fold, with the plan agreed. Returns the folds trained or found complete."""
    args, machine, planner = run.args, run.machine, run.planner
    queue = workers.FoldQueue(Path(args.out_dir) / ".folds") if parallel.fold_worker() else None
    trained = []
    for k, (trn_idx, val_idx) in enumerate(splits):
        if queue is not None:
            planner.agreed(queue.cap(planner.folds))
        if parallel.agree_plan(planner, machine.device) or k >= planner.folds:
            break
        if queue is not None and not queue.take(k):
            continue  # another worker has it (to train, or found complete)
        done = finished(comp, run, k)
        print(f"FOLD {k} ({k + 1} of {planner.folds}): {len(trn_idx)} train, {len(val_idx)} valid")
        if done:
            resumed(run, k, done)
        else:
            first = not planner.times.epoch_s  # the first fold this process trains: probe, Model line, estimate
            planner.times.begin_fold(k)
            fold = comp.fold(k, trn_idx, dry_run_rows(val_idx, k) if args.dry_run else val_idx)
            best = train_fold(comp, fold, len(trn_idx), run, first)
            planner.end_fold(k, first, fold.val_losses)  # its val losses: growth's evidence for more epochs
            print(f"FOLD {k} DONE: best val loss {best:.4f}, {planner.elapsed():.0f}s elapsed")
            parallel.barrier()  # rank 0 has written the fold's files before any rank looks for them
        trained.append(k)
    return trained


def grow(comp, splits: list, trained: list[int], run: Run, queue=None) -> list[int]:
    """The plan's folds are trained with time to spare: first the folds a cut plan left out (each
    while it fits), then TTA views, then the same folds again from other seeds (growth.py's
    rules), each fold added only when it and its prediction fit; a GROW line says each step and
    why. A fold cut by the deadline or SIGTERM is never ensembled (growth.partial_oof_name).
    A fold worker (`queue`) claims the folds given back and the seeds' folds as it claimed the
    plan's (Kaggle's T4x2 had grown nothing, and most of 9 hours went unused); no TTA views (they
    need every fold's OOF). Returns the folds trained (the plan's, and those given back)."""
    planner = run.planner
    why = growth.why_not(run.args, planner, worker=queue is not None)
    if why:
        print(f"GROW: none ({why})")
        return trained
    if growth_fold_s(planner) <= 0:
        print("GROW: none (nothing timed: every planned fold was resumed from checkpoints that record no timing)")
        return trained
    trained = folds_back(comp, splits, trained, run, queue)
    taken = queue.claims() if queue is not None else trained  # a fold worker's: every worker's
    if len(taken) < len(splits):  # a fold of the split does not fit: nor does a seed's (the same size)
        return trained
    if queue is not None:  # predict.py ensembles every fold of the split: the reserve counts them
        planner.fold_back(len(splits) - 1)
    else:
        tta_views.grow(comp, splits, run)  # first: the seeds' fit checks count the views' price
    grow_seeds(comp, splits, run, queue)
    return trained


def folds_back(comp, splits: list, trained: list[int], run: Run, queue=None) -> list[int]:
    """The folds of the split a cut plan left out, trained before any seed grows, each while it and
    its share of prediction fit (a loaded 2-core machine cut a table's plan 5->3 and its MLP spent
    61% of the training time on seeds while folds 3 and 4 were never trained: the blend was fitted
    on 720 of 1,200 rows); at the plan's epochs, or the most that fit down to the fewest the plan
    gave a fold (Timings.shortest: epochs given back in fold 1 raised a plan of 15 to 20, and fold
    2 at 15 was not tried; a segmentation run left 35% of its budget). A fold worker (`queue`)
    claims each as it claimed the plan's folds (Kaggle's T4x2 grew the seeds of a plan cut 5->3,
    and folds 3 and 4 were never trained). Returns the folds trained."""
    planner = run.planner
    for k in range(len(splits)):
        if k in trained or (queue is not None and queue.claimed(k)):
            continue  # this process's, or another worker's
        done = finished(comp, run, k)  # an earlier run gave it back (a rerun retrained it, overwriting it)
        least = planner.times.shortest(planner.epochs)
        epochs, said = grown_epochs(planner, planner.epochs, least)
        if not done and (planner.stop_reason or not epochs):
            print(f"GROW: stop before fold {k} of the split ({planner.stop_reason or said}): no seeds either")
            break
        if queue is not None and not queue.take(k):
            continue  # another worker took it meanwhile
        line = growth.back_line(k, planner.folds, (epochs, planner.epochs, least), said)  # the plan's folds before
        planner.fold_back(k)
        trained.append(k)
        if done:
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
        print(f"FOLD {k} DONE: best val loss {best:.4f}, {planner.elapsed():.0f}s elapsed")
        if planner.stop_reason:
            break
    return trained


def finished(comp, run: Run, k: int) -> dict | None:
    """Fold `k`'s checkpoint in --out-dir when it is complete and of this run's settings (resume), else None."""
    config = artifacts.checkpoint_config(run.args, run.machine, run.batching)
    return storage.finished_fold(Path(run.args.out_dir) / f"model_fold{k}.pth", config, artifacts.run_keys(comp))


def resumed(run: Run, k: int, done: dict) -> None:
    """Fold `k` is skipped, complete (`done`: its checkpoint): its recorded timing stands for this
    process's measure (growth prices what it adds by it)."""
    print(f"FOLD {k}: model_fold{k}.pth is complete, skipping (resume)")
    run.planner.resumed_fold(done.get("timing"))


def grow_seeds(comp, splits: list, run: Run, queue=None) -> None:
    """The same folds again from other seeds, each fold added only when it and its prediction fit;
    a fold worker (`queue`) takes the (seed, fold) units no other worker has."""
    planner = run.planner
    target, more = growth.epochs_target(planner.epochs, planner.times.val_curves)
    fits = grown_epochs(planner, target)[0] > 0  # a shorter fold counts
    ok, said = growth.start(
        planner.training_left(), planner.training_time(), growth_fold_s(planner), planner.prediction.fold_s, fits
    )
    print(f"GROW: {'more seeds' if ok else 'none'}: {said}{'; ' + more if ok and more else ''}")
    for seed_no in range(2, growth.MAX_SEEDS + 1 if ok else 2):
        for k, (trn_idx, val_idx) in enumerate(splits):
            if queue is not None and not queue.take(k, seed_no):
                continue  # another worker has it
            if queue is not None:  # every worker's grown folds: predict.py ensembles them all (the reserve)
                planner.prediction.set_grown(queue.grown() - 1)
            if not grow_fold(comp, (k, trn_idx, val_idx), seed_no, run, target):
                return
    if ok and queue is None:  # a fold worker's units end where the other workers' go on
        print(growth.capped(planner.training_left()))


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
    default the plan's epochs: a seed averaged into its fold), 0 when none does (growth.grown_epochs)."""
    fold, left = growth_fold(planner), planner.training_left()
    said = f"a fold takes ~{fmt_s(fold[0])}, {fmt_s(max(0.0, left))} training time left"
    epoch_s = statistics.median(planner.times.epoch_s) if planner.times.epoch_s else 0.0
    least = planner.epochs if least is None else least
    return growth.grown_epochs(target, left, fold, epoch_s, planner.prediction.fold_s, least), said


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


def train_on_workers(comp, run: Run, run_id: str) -> tuple[list[int], list[str]]:
    """--parallel folds: one worker per device trains folds from a shared queue; returns the
    folds to score (taken by a worker this run, or complete from an earlier one) and a line for
    each worker that died (its current fold is lost; the others go on)."""
    args, machine, planner = run.args, run.machine, run.planner
    out, devices = Path(args.out_dir), parallel.devices_for(args.devices, machine.device)
    start = time.time() - planner.elapsed()  # one deadline for every worker
    result = workers.run_fold_workers(devices, planner.folds, run_id, out, start, planner)
    claimed, lost = set(result["claims"]), workers.lost_folds(result, planner)
    if lost and not planner.stop_reason and (not planner.budget or planner.training_left() > 0):
        # a worker killed by another (the OOM killer, a GPU fault): its fold trained again, once
        print(f"PARALLEL: {'; '.join(lost)}: the workers start again once for it (complete folds skipped, no growth)")
        result = workers.run_fold_workers(devices, result["cap"], run_id, out, start, planner, again=True)
        claimed, lost = claimed | set(result["claims"]), workers.lost_folds(result, planner)
    config = artifacts.checkpoint_config(args, machine, run.batching)
    done = {
        k
        for k in range(result["cap"])
        if storage.fold_is_done(out / f"model_fold{k}.pth", config, artifacts.run_keys(comp))
    }
    return sorted(done | claimed), lost


def experiment_row(comp, run: Run, run_id: str) -> dict:
    """What the experiments row says of a run before it trains."""
    args, batching = run.args, run.batching
    return {
        "run": run_id,
        "git": experiments.git_commit(),
        **comp.describe,
        "model": comp.name,
        "batch": f"{batching.size}x{batching.accum_steps}",
        "lr": f"{batching.lr:.2e}",
        "folds_planned": args.folds,
        "epochs_planned": args.epochs,
        "metric": comp.metric_name,
        "higher_is_better": comp.higher_is_better,
    }


def finish(comp, run: Run, trained: list[int], row: dict) -> dict:
    """After the folds: oof.csv and the OOF line, the report picture, the experiments row."""
    args, machine, batching, planner, jlog = run.args, run.machine, run.batching, run.planner, run.jlog
    out, config = Path(args.out_dir), artifacts.checkpoint_config(args, machine, batching)
    counted = artifacts.grown_seeds(comp, out, trained, config)  # each grown seed's checkpoint read once
    counted = artifacts.kept_seeds(comp, out, trained, args.signature, counted)  # none, when they lose
    judge = args.hand_in == "judged" and not args.dry_run  # a dry run checks the path
    scores, fold_scores, rows = artifacts.oof_scores(comp, out, trained, args.signature, counted, judge)
    where = describe_gpu(machine.device)[0] if machine.device.type == "cuda" else "CPU"
    logs.write_report(jlog.records, out / "train_report.png", f"{comp.name} on {where}")
    experiments.append_or_say(
        out / "experiments.csv",
        {
            **row,
            "batch": f"{batching.size}x{batching.accum_steps}",  # the probe or an OOM may have changed it
            "lr": f"{batching.lr:.2e}",
            "folds_done": len(fold_scores),
            "seeds": growth.seeds_column(trained, lambda k, s: (k, s) in counted),
            "epochs_done": " ".join(str(sum(r["fold"] == k for r in jlog.records)) for k in trained),
            "cv": f"{list(scores.values())[-1]:.5f}" if scores else "",
            "fold_scores": " ".join(f"{s:.4f}" for s in fold_scores),
            "oof_rows": rows,
            "wall_s": f"{planner.elapsed():.0f}",
            "stop": planner.stop_reason or ("dry run" if args.dry_run else "done"),
        },
        "still says it is running (the folds are saved)",
    )
    if planner.stop_reason:
        print(logs.stopped_line(planner.stop_reason))
    run.folds_done = len(trained)  # runs.Run.done's DONE line, once train.py has nothing left to write
    return scores
