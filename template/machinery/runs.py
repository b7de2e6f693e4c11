"""One run of train.py as one object: the parsed flags, the machine (device, precision, loader),
the batching (batch, accumulation, LR), the time planner and the JSON log, built by one function
and passed by name, from train.py's `main()` through the fold loop, growth and the finish.

The tasks that read their data through a DataLoader (image, segmentation, detection, audio) each
held the same ten lines of set-up in their `main()` (issue 58: the run setup, word for word in four
train.py files); `start` is those lines once. Tables and text batch from memory and size their
batch by their own rules: `in_process` is their machine and `begin` their run. Each train.py keeps
what is the competition's: its recommendation's inputs (model, image or spectrogram size), its
data, its splits. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

# engine's functions through the module: tests and tune.py wrap them there
from . import engine, hardware, parallel, runflags
from .machine import Batching, Machine, batch_set_by_user
from .planner import TimePlanner

# DONE's next step under run.py (train.py --predict-beside): its predict.py, started beside train.py,
# hands in; the RUN: line says what (the ensemble, or the fallback where the folds were judged worse)
BESIDE_NEXT = "run.py's predict.py (started beside train.py) hands in; its RUN: line says what"


@dataclass
class Run:
    args: object  # train.py's parsed flags (engine.begin checked them)
    machine: Machine  # the device (machine.device), precision and loader
    batching: Batching
    planner: TimePlanner
    jlog: object = None  # logs.JsonLog, opened as cross_validate starts (rank 0 alone writes its file)
    trained: list | None = None  # the folds this run has, once engine.finish scored them (None in a fold worker)
    seeds_left: bool = False  # growth reached the seeds and left them for later (engine.more_seeds)

    @property
    def folds_done(self) -> int | None:
        """How many folds this run has (the DONE line's), once engine.finish scored them."""
        return None if self.trained is None else len(self.trained)

    def fit_steps(self, rows: int) -> None:
        """Small data: the batch shrinks so an epoch of a fold's training rows keeps enough optimizer
        steps (machine.fit_steps); a batch you set (--batch-size / --accum-steps) is kept as given."""
        if not batch_set_by_user(self.args):
            engine.fit_steps(self.batching, rows * (self.args.folds - 1) // self.args.folds, self.args.lr)

    def cross_validate(self, comp, splits, done: bool = True):
        """The folds (`folds`), after the batch for small data (fit_steps: comp.train's rows); and
        --pretrained without a local --weights file builds the model once: offline (Kaggle) the
        download fails in seconds, as the dry run does, not when fold 0 starts."""
        self.fit_steps(len(comp.train))
        if getattr(self.args, "pretrained", False) and not getattr(self.args, "weights", ""):
            comp.build_model(None)
        return self.folds(comp, splits, done)

    def folds(self, comp, splits, done: bool = True, seeds: bool = True):
        """engine.cross_validate of this run, the batch as it is; then the DONE line, unless train.py
        has more to write after the folds (done=False: it ends with run.done()). `seeds` False: the
        seeds wait for `more_seeds` (a table's MLP, placed among the boosters' by the blend)."""
        scores = engine.cross_validate(comp, splits, self, seeds)
        if done:
            self.done()
        return scores

    def more_seeds(self, comp, splits) -> dict:
        """engine.more_seeds of this run: the seeds `folds(..., seeds=False)` left, then their OOF."""
        return engine.more_seeds(comp, splits, self)

    def done(self, folds: int | None = None) -> None:
        """train.py's last line, once nothing is left to write: DONE, the folds this run has, and
        the predict.py command that reads them (a person or an agent starts it on this line), or,
        under run.py, that its predict.py hands them in (it said `next: python predict.py` there,
        where run.py's own predict.py was already started: a second one would predict beside it).
        Only the process that scored the folds says it, not a fold worker or a DDP rank."""
        folds = self.folds_done if folds is None else folds
        if folds is None or not parallel.writes() or parallel.fold_worker():
            return
        # no fold at all: predict.py alone would stop (no model); the submission is the fallback train.py wrote
        if not folds:
            then = f"{Path(self.args.out_dir) / 'submission.csv'} is train.py's fallback"
        elif self.args.predict_beside:  # run.py's predict.py is started: it predicts on these folds
            then = f"next: {BESIDE_NEXT}"
        else:
            then = f"next: {runflags.predict_command(self.args)}"
        print(f"DONE: {folds} folds in {self.planner.elapsed():.1f}s; {then}")


def start(args, device: torch.device, side: int, decoder: str | None = None) -> Run:
    """The run for this card's profile (engine.profile) and hardware.recommend's batch,
    accumulation and memory layout for --model at `side` px (a segmentation `decoder` shrinks the
    batch): the loader's workers (--workers, else the usable CPUs less one; none on the CPU), the machine, the
    batching at the rule's LR, the start lines (RESOURCES, GPU Memory, DataLoader, BATCH) and the
    time planner."""
    profile = engine.profile(args.gpu, device)
    rec = hardware.recommend(profile, args.model, side, hardware.usable_cpus(), args.batch_size, decoder)
    loader = hardware.flag_loader(args.workers, device.type)
    machine = engine.make_machine(device, args.amp, loader, rec.channels_last)
    accum = args.accum_steps or rec.accum_steps
    batching = Batching(rec.batch_size, accum, hardware.scaled_lr(args.lr, rec.batch_size * accum))
    return begin(args, machine, batching, rec.why["batch_size"])


def in_process(device: torch.device, amp: str, note: str) -> Machine:
    """The machine of a task whose batches come from memory, not a DataLoader (a table's tensors,
    text's cached token ids): no loader workers; `note` says how it batches on the DataLoader line."""
    loader = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "note": note}
    return engine.make_machine(device, amp, loader, channels_last=False)


def begin(args, machine: Machine, batching: Batching, why: str) -> Run:
    """The run from its parts: the start lines (RESOURCES, GPU Memory, DataLoader, BATCH; `why`
    says who set the batch) and the time planner."""
    engine.print_start(machine, batching, why)
    return Run(args, machine, batching, engine.make_planner(args, machine))
