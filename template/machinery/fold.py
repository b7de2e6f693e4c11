"""One fold's training: the model built and wrapped, the epoch loop with its deadline guard,
validation, early stopping and the fold's best checkpoint and OOF file.

engine.py's fold loop calls `train_fold` once per fold; steps.py holds the step loop inside an
epoch (AMP, accumulation, OOM recovery). It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import artifacts, compiling, growth, logs, parallel, probe, room, storage
from .machine import Batching, Machine, batch_set_by_user
from .steps import loader, make_optimizer, predict, run_epoch, to_device, warmup_cosine

if TYPE_CHECKING:  # runs.py builds the run (and imports engine, which imports this module)
    from .runs import Run


@dataclass
class Fold:
    """One fold's data, as the competition's `fold()` returns it."""

    index: int
    train: Any  # the training rows, in whatever form the competition's loader takes
    valid: Any
    y_valid: np.ndarray  # targets of the validation rows, in order (scored, written to the OOF file)
    ids_valid: np.ndarray
    extras: dict = field(default_factory=dict)  # saved beside the weights (a fitted preprocessor's state)
    seed_no: int = 1  # growth.py: 2, 3, ... for the same fold trained again from another seed
    val_losses: list = field(default_factory=list)  # each epoch's, kept by evaluate: growth's evidence for more epochs

    @property
    def checkpoint(self) -> str:
        return growth.checkpoint_name(self.index, self.seed_no)

    @property
    def oof(self) -> str:
        """The OOF file this fold writes while it trains: a grown seed's is partial until the fold ends."""
        return growth.oof_name(self.index) if self.seed_no == 1 else growth.partial_oof_name(self.index, self.seed_no)


# ----------------------------------------------------------------------------- the epoch watcher

# tune.py's one seam into the loop: a watcher's epoch(fold, epoch, val_loss, metric) is called
# after every validated epoch (a returned string stops the run, as the deadline does, with that
# reason), and its stopped(reason) when cross_validate ends (None: it ran to its end).
_WATCHERS: list = []


@contextlib.contextmanager
def watching(watcher):
    """Every cross_validate inside this block reports its epochs to `watcher` (optuna's trial)."""
    _WATCHERS.append(watcher)
    try:
        yield watcher
    finally:
        _WATCHERS.remove(watcher)


def tell_watchers(fold: int, epoch: int, val_loss: float, metric: float) -> str | None:
    reasons = [w.epoch(fold, epoch, val_loss, metric) for w in _WATCHERS]
    return next((r for r in reasons if r), None)


def watchers_started(args) -> None:
    """The run's signatures to the watchers that record them (tune.py's trial: best_params.json's)."""
    watchers = [w for w in _WATCHERS if hasattr(w, "started")]
    if watchers:  # the second stat walk of the data only where a search records it
        params = artifacts.params_signature(args)
        for watcher in watchers:
            watcher.started(args.signature, params)


def watchers_stopped(reason: str | None) -> None:
    for watcher in _WATCHERS:
        watcher.stopped(reason)


# ----------------------------------------------------------------------------- one fold


def train_fold(comp, fold: Fold, n_train, run: Run, first: bool) -> float:
    """Train one fold of `run` (runs.Run), its best epoch kept in fold.checkpoint; returns its best val loss."""
    args, machine, batching, planner = run.args, run.machine, run.batching, run.planner
    k, out = fold.index, Path(args.out_dir)
    model, bare, optimizer, grads, model_s = build(comp, fold, n_train, run, first)
    train_sampler = parallel.sampler(fold.train, train=True, seed=args.seed)  # None without DDP
    train_batches = loader(comp, fold.train, batching.size, True, train_sampler)
    valid_batches = loader(comp, fold.valid, batching.eval_rows, False, parallel.sampler(fold.valid, False, args.seed))
    model = compiling.settle(model, bare, train_batches, comp.batch_loss, args, machine, batching.parts, first)
    n_batches = min(len(train_batches), 3 if args.dry_run else len(train_batches))
    scheduler = warmup_cosine(optimizer, math.ceil(n_batches / batching.accum_steps), lambda: planner.epochs)

    def batch_loss(batch):
        return comp.batch_loss(model, to_device(batch, machine))

    def should_stop(i: int) -> bool:
        planner.tick(i)
        return parallel.agree_plan(planner, machine.device)  # DDP: one decision for every rank

    def save(epoch: int, **meta) -> None:
        config = artifacts.checkpoint_config(args, machine, batching)
        save_fold(out / fold.checkpoint, model, comp, fold, config, epoch=epoch, **meta)

    best, bad_epochs, saved, last_peak, lines = math.inf, 0, False, None, logs.EpochLines()
    on_first_step = (lambda: first_step_lines(machine, batching)) if first else None
    for epoch in range(1, max(args.epochs, planner.epochs) + 1):  # a grown seed may train more (growth.py)
        planner.can_start_epoch()  # the deadline guard: sets stop_reason when the epoch would not fit
        if parallel.agree_plan(planner, machine.device) or epoch > planner.epochs:
            break
        t0 = time.time()
        train_loss, seen = train_epoch(
            model, (train_batches, train_sampler, n_batches, len(valid_batches)), (k, epoch), batch_loss, optimizer,
            scheduler, machine, batching, planner, on_first_step, should_stop, grads,
        )  # fmt: skip
        train_time, on_first_step = time.time() - t0, None
        if parallel.agree_plan(planner, machine.device):  # deadline or SIGTERM mid-epoch: no time to validate
            if not saved:  # better an unvalidated model than no submission
                save(epoch, complete=False)
            lines.flush()
            print(f"STOPPED: fold {k} epoch {epoch} ({planner.stop_reason}); best checkpoint kept")
            break
        y, pred = validate(comp, fold, bare, valid_batches, run, epoch, (t0, train_time, model_s))
        val_loss, metric = evaluate(comp, fold, y, pred, f"fold {k} epoch {epoch}")
        stats = dict(train_loss=train_loss, val_loss=val_loss, metric=metric, lr=scheduler.get_last_lr()[0])
        stats.update(time_s=time.time() - t0, samples_per_s=seen / max(train_time, 1e-9))
        last_peak = log_epoch(comp, (k, epoch, lines), stats, run, last_peak)
        if val_loss < best:
            best, bad_epochs, saved = val_loss, 0, True
            save(epoch, val_loss=best, complete=False)
            if parallel.writes():
                artifacts.write_oof(comp, fold, y, pred, out / fold.oof, args)
        elif stops_early(bad_epochs := bad_epochs + 1, epoch, args.patience, planner.epochs):  # one more bad epoch
            lines.flush()
            print(f"EARLY STOP: fold {k} epoch {epoch}, no better val loss for {args.patience} epochs")
            break
    lines.flush()
    print(planner.status_line())  # one per fold
    finish_fold(model, fold, out, machine, planner)
    return best


def stops_early(bad_epochs: int, epoch: int, patience: int, planned: int) -> bool:
    """`patience` epochs without a better val loss, but never in the first third of the `planned`
    epochs: the LR is still near its peak there, and a flat val loss is its noise (with patience 3,
    audio on unheard voices and detection lost whole folds at epoch 4, their val loss near the prior)."""
    return bad_epochs >= patience and epoch >= math.ceil(planned / 3)


def finish_fold(model, fold: Fold, out: Path, machine, planner) -> None:
    """DDP: every rank's weights checked equal; the fold's checkpoint marked complete (a run
    stopped by the deadline or SIGTERM leaves it incomplete: a rerun trains the fold again), and a
    grown seed's OOF file put in place (a cut one never counts)."""
    parallel.check_in_sync(model, machine.device)
    if planner.stop_reason is not None or not parallel.writes():
        return
    # a rerun that resumes the fold prices growth by it, and knows the epochs it was planned for
    timing = planner.times.fold_timing(planner.prediction.fold_s, planner.epochs)
    mark = functools.partial(storage.mark_complete, out / fold.checkpoint, timing=timing)  # rewritten: a copy's room
    if not room.with_room(out / fold.checkpoint, mark, ahead=True):
        print(f"WARNING: fold {fold.index} never produced a finite val loss; no checkpoint written")
    elif fold.seed_no > 1 and (out / fold.oof).exists():
        (out / fold.oof).replace(out / growth.oof_name(fold.index, fold.seed_no))


def train_epoch(
    model, data: tuple, at: tuple, batch_loss, optimizer, scheduler, machine, batching, planner, on_first_step,
    should_stop, grads,
) -> tuple[float, int]:  # fmt: skip
    """One epoch's training pass (steps.run_epoch) with the planner told and, under DDP, a new
    shuffle and rank 0's BatchNorm statistics, and its progress shown (logs.StepProgress). `at` is
    (fold, epoch). Returns (mean loss over every rank, samples seen)."""
    train_batches, train_sampler, n_batches, n_valid = data
    k, epoch = at
    machine.monitor.reset()
    planner.times.begin_epoch(n_batches, n_valid)
    if train_sampler is not None:
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    model.train()
    epoch_args = (n_batches, batch_loss, optimizer, scheduler, machine.amp, batching, on_first_step)
    progress = logs.StepProgress(f"fold {k} epoch {epoch}", n_batches)
    train_loss, seen = run_epoch(train_batches, *epoch_args, should_stop, grads, progress)
    grads.sync_buffers()  # DDP: validate rank 0's BatchNorm statistics, the ones saved
    return parallel.mean(train_loss, machine.device), seen * batching.world


def build(comp, fold: Fold, n_train: int, run: Run, first: bool):
    """The fold's model on the device (the Model line and the batch probe before the first fold),
    its optimizer and the DDP wrap (--compile: compiling.settle). Returns (model, bare model, optimizer, GradSync,
    seconds to build the model: predict.py builds one per fold, part of the reserve)."""
    args, machine, batching = run.args, run.machine, run.batching
    t_model = time.time()
    model = comp.build_model(fold).to(machine.device)
    model_s = time.time() - t_model
    if machine.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if first:
        print(logs.model_line(comp.name, sum(p.numel() for p in model.parameters()) / 1e6))
    optimizer = make_optimizer(comp, model, batching.lr, args.weight_decay)
    if first and batch_set_by_user(args):  # the VALIDATION line's reason, with the probe or without
        batching.why = ("user", f"--batch-size {args.batch_size} / --accum-steps {args.accum_steps}")
    if first and getattr(args, "autoscale", False) and machine.device.type == "cuda":
        if batch_set_by_user(args):  # the user's numbers are kept as given
            print(f"BATCH PROBE: skipped: --batch-size {args.batch_size} / --accum-steps {args.accum_steps} set by you")
        else:  # per GPU, on the bare model (no all-reduce); under DDP every rank takes the smallest batch
            probe.autoscale(comp, fold, n_train // batching.world, model, optimizer, machine, batching, args.lr)
            probe.agree_batching(batching, args.lr, machine.device, optimizer)
    bare = model  # validation runs on the module itself: DDP's forward holds collectives
    model = parallel.wrap(model, machine.device)  # DDP: rank 0's weights broadcast to every rank
    grads = parallel.GradSync(model, machine.device)  # DDP: local backward, OOM agreed, one all-reduce
    return model, bare, optimizer, grads, model_s


def first_step_lines(machine: Machine, batching: Batching) -> None:
    """After the first optimizer step: the GPU memory lines (cuBLAS/cuDNN handles exist by then)."""
    machine.monitor.measure_outside()
    if batching.parts > 1:  # the first step ran out of memory: OOM recovery split the batch
        micro = -(-batching.size // batching.parts)
        batching.why = ("oom", f"batch {batching.size} ran out of memory: micro-batches of {micro}")
    print(*logs.memory_used_lines(machine.monitor.peak(), batching.size, batching.why), sep="\n")


DRY_RUN_BATCHES = 2  # a dry run validates this many batches of each fold: the whole path, not a score


def dry_run_rows(val_idx, k: int) -> np.ndarray:
    """A dry run's validation rows, in a shuffled order (seeded by the fold): its DRY_RUN_BATCHES
    are a sample of the fold, not its first rows. Rows in class order (class folders, a sorted
    labels file) had them hold one or two classes, and the OOF line said Acc=0.0000."""
    return np.random.default_rng(k).permutation(np.asarray(val_idx))


def validate(comp, fold: Fold, bare, valid_batches, run: Run, epoch: int, timing) -> tuple:
    """The validation pass on the bare model; after the first epoch its speed becomes the
    prediction estimate (the planner's reserve). Returns (targets, predictions), every rank's."""
    (t0, train_time, model_s), machine, planner = timing, run.machine, run.planner
    dry = DRY_RUN_BATCHES if run.args.dry_run else None
    pred = predict(comp.predict, bare, valid_batches, machine, max_batches=dry)
    if epoch == 1:  # validation speed -> the prediction estimate -> the reserve
        valid_s = time.time() - t0 - train_time
        setup = getattr(comp, "predict_setup_s", None) if planner.budget else None  # audio: the ONNX export
        if setup:
            t_setup = time.time()
            model_s += setup(bare)
            planner.times.leave_out(time.time() - t_setup)  # timed once: not an epoch's cost
        planner.prediction.note_inference(valid_s, len(pred), comp.test_rows, comp.test_views, comp.decode_s, model_s)
    pred = parallel.gather_rows(pred, len(fold.y_valid), machine.device)  # DDP: every rank's share, in order
    planner.end_epoch(epoch)
    return fold.y_valid[: len(pred)], pred


def evaluate(comp, fold: Fold, y: np.ndarray, pred: np.ndarray, where: str) -> tuple[float, float]:
    """(val loss, metric) of one validation pass, the loss also kept in fold.val_losses (growth's
    evidence for more epochs). Non-finite predictions (a diverged model: NaN weights) score inf /
    NaN with a warning instead of crashing the metric: that epoch is never the best one, so it is
    never saved."""
    if not np.isfinite(pred).all():
        print(f"WARNING: {where}: the model's predictions are not finite (training diverged: lower --lr)")
        fold.val_losses.append(math.inf)
        return math.inf, math.nan
    fold.val_losses.append(comp.val_loss(y, pred))
    return fold.val_losses[-1], list(comp.score(y, pred).values())[-1]


def log_epoch(comp, at: tuple, stats: dict, run: Run, last_peak):
    """The Epoch line (at most one a second: logs.EpochLines; TIME when the plan changed), tune.py's
    watcher, a memory-drop line and the JSON record. `at` is (fold, epoch, the fold's EpochLines).
    Returns this epoch's memory peak (the next epoch's drop is measured from it)."""
    (k, epoch, lines), machine, batching, planner = at, run.machine, run.batching, run.planner
    lines.show(logs.epoch_line(epoch, stats, comp.metric_name, machine.monitor.field()))
    if planner.plan_changed:
        lines.flush()
        print(planner.status_line())
    if reason := tell_watchers(k, epoch, stats["val_loss"], stats["metric"]):  # tune.py: optuna pruned the trial
        planner.request_stop(reason)
    peak = machine.monitor.peak()
    if drop := logs.memory_drop_line(last_peak, peak):
        lines.flush()
        print(drop)
    run.jlog.write(
        fold=k,
        epoch=epoch,
        **stats,
        batch_size=batching.size,
        batch_set_by=batching.why[0],
        accum_steps=batching.accum_steps,
        gpu_used_gb=peak and peak[0],
        gpu_pct=peak and peak[2],
        elapsed_s=planner.elapsed(),
        metric_name=comp.metric_name,
    )
    return peak


def save_fold(path: Path, model, comp, fold: Fold, config: dict, **meta) -> None:
    """The fold's checkpoint (rank 0 alone writes): weights, the resolved config, the class list,
    the run's signature (what makes folds of one ensemble) and the fold's extras."""
    if not parallel.writes():
        return
    run = {key: storage.setting(config, key) for key in artifacts.run_keys(comp)}  # what makes folds of one ensemble
    saved = {"fold": fold.index, "seed_no": fold.seed_no, "run": run, "saved_at": time.time()}
    write = functools.partial(
        storage.save_checkpoint, path, model, config, comp.classes, **saved, **meta, **fold.extras
    )
    room.with_room(path, write, ahead=True)  # a full disk: the test set's cache made ahead gives its room
