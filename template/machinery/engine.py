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
    predict_ensemble(models, batch) -> Tensor  optional, where oof_averages is False: predict() by a
                                             fold's seeds ensembled as predict.py ensembles them; their
                                             OOF rows judge grown seeds (seeds_oof.py: masks)
    valid_views: int                         optional, 1: the views of test_views validation predicts
                                             (masks, boxes: predict.py's each, its default TTA), for
                                             the price of seeds_oof.py's pass
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
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import artifacts, experiments, growth, logs, parallel, seeds_oof, tta_views, workers
from .artifacts import copy_oof, fallback_submission, fixed_folds, read_targets, target_columns
from .errors import RunError
from .fold import Fold, dry_run_rows, train_fold, watchers_started, watchers_stopped, watching
from .gpu import describe_gpu
from .growing import finished, grow, grow_seeds, resumed
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
    "more_seeds",
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


def cross_validate(comp, splits, run: Run, seeds: bool = True) -> dict:
    """Train every fold the plan allows, then score the OOF predictions. Returns the OOF scores.

    `splits` is an iterable of (train indices, validation indices), e.g. StratifiedKFold's.
    `run` (runs.Run) is the run by name: its flags (`run.args`: out_dir, epochs, patience, weight_decay,
    compile, autoscale (CUDA only), dry_run, parallel and the config saved with each checkpoint), the
    machine, the batching and the time planner; the JSON log is opened here, as `run.jlog`.
    With --parallel folds this process starts one worker per device (parallel.py), which train
    the folds; it then scores them and writes the report, as a sequential run does.
    `seeds` False (one process training every fold): growth adds the folds a cut plan left out and
    the TTA views, and leaves the seeds to `more_seeds` (a table's MLP, after the boosters the
    blend weighs more: tree_seeds.py).
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
                trained = grow(comp, splits, trained, run, queue, seeds)
    if worker or not parallel.writes():  # the parent train.py (or rank 0) scores and reports
        if worker and planner.stop_reason:
            print(logs.stopped_line(planner.stop_reason))
        parallel.finish_ddp()
        return {}
    scores = finish(comp, run, trained, row, splits)
    watchers_stopped(planner.stop_reason)
    parallel.finish_ddp()
    if lost:
        raise RunError("; ".join(lost) + ": rerun the command to train the lost fold(s) (finished ones are skipped)")
    return scores


def more_seeds(comp, splits, run: Run) -> dict:
    """The seeds `cross_validate(..., seeds=False)` left (`run.seeds_left`: its growth reached them),
    grown by growth.py's rules on the training time left now, then the finish again: the grown seeds
    judged, oof.csv and its OOF line, the report and the experiments row. Returns the OOF scores, {}
    when no seed's fold fitted (the first finish stands). A table's MLP: its seeds grew before the
    boosters' whatever the blend weighed it, and a 4-minute run of a 9,000-row table spent ~70 s on
    20 MLP folds the blend then weighed 0 (tree_seeds.seed_order places them now)."""
    if not run.seeds_left or run.planner.stop_reason:  # a stop: train.py ends on what it has
        return {}
    run.seeds_left, planner = False, run.planner
    row = experiment_row(comp, run, run.jlog.run)
    with experiments.recording(Path(run.args.out_dir) / "experiments.csv", row, planner.elapsed):
        grew = grow_seeds(comp, splits, run)
    if not grew:
        return {}
    scores = finish(comp, run, run.trained, row, splits)
    watchers_stopped(planner.stop_reason)
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
            if queue is not None:  # ...every worker's (growing.grow_seeds)
                queue.add_curve(k, fold.val_losses, planner.times.fold_planned[-1])
            print(f"FOLD {k} DONE: best val loss {best:.4f}, {planner.elapsed():.0f}s elapsed")
            parallel.barrier()  # rank 0 has written the fold's files before any rank looks for them
        trained.append(k)
    return trained


def train_on_workers(comp, run: Run, run_id: str) -> tuple[list[int], list[str]]:
    """--parallel folds: one worker per device trains folds from a shared queue; returns the
    folds to score (taken by a worker this run, or complete from an earlier one) and a line for
    each worker that died (its current fold is lost; the others go on)."""
    args, machine, planner = run.args, run.machine, run.planner
    out, devices = Path(args.out_dir), parallel.devices_for(args.devices, machine.device)
    start = time.time() - planner.elapsed()  # one deadline for every worker
    result = workers.run_fold_workers(devices, planner.folds, run_id, out, start, planner)

    def complete(k: int) -> bool:
        return finished(comp, run, k) is not None

    claimed, lost = set(result["claims"]), workers.lost_folds(result, planner, complete)
    if lost and not planner.stop_reason and (not planner.budget or planner.training_left() > 0):
        # a worker killed by another (the OOM killer, a GPU fault): its fold trained again, once
        print(f"PARALLEL: {'; '.join(lost)}: the workers start again once for it (complete folds skipped, no growth)")
        result = workers.run_fold_workers(devices, result["cap"], run_id, out, start, planner, again=True)
        claimed, lost = claimed | set(result["claims"]), workers.lost_folds(result, planner, complete)
    found = {k: finished(comp, run, k) for k in range(result["cap"])}
    for done in filter(None, found.values()):  # the workers' measures stand for this process's: its
        planner.resumed_fold(done.get("timing"))  # reserve, and the price of seeds_oof's pass
    return sorted({k for k, done in found.items() if done is not None} | claimed), lost


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


def finish(comp, run: Run, trained: list[int], row: dict, splits: list) -> dict:
    """After the folds: the grown seeds judged, oof.csv and the OOF line, the report picture, the
    experiments row."""
    args, machine, batching, planner, jlog = run.args, run.machine, run.batching, run.planner, run.jlog
    out, config = Path(args.out_dir), artifacts.checkpoint_config(args, machine, batching)
    counted = artifacts.grown_seeds(comp, out, trained, config)  # each grown seed's checkpoint read once
    seeds_oof.write(comp, splits, run, counted)  # masks: each fold's seeds ensembled on its rows, to judge them
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
    run.trained = trained  # runs.Run.done's DONE line, once train.py has nothing left to write; more_seeds's folds
    return scores
