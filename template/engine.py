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
    test_rows, test_views, decode_s: int, int, float
                            prediction's work (rows x views, seconds per row to prepare) for the reserve
    fold(k, trn_idx, val_idx) -> Fold        the fold's rows, with anything fitted on the training part
    loader(rows, batch, train) -> batches    a sized iterable of batches (tuples of tensors)
    build_model(fold) -> torch.nn.Module
    batch_loss(model, batch) -> (mean loss, rows)  the batch is on the device; runs under autocast
    predict(model, batch) -> Tensor (rows, columns) probabilities or values, one column per oof_columns
    val_loss(y, pred) -> float               lower is better: early stopping and the best checkpoint
    score(y, pred) -> dict[str, float]       the figures the OOF line prints; the last is the metric
    param_groups(model) -> list[dict]        optional: parameter groups, each with an `lr_scale`
                                             (text: layer-wise LR decay and a head LR)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import experiments
import gpu
import hardware
import logs
import parallel
import planner as time_planner
import storage
from errors import DataError, RunError, one_line_errors
from gpu import Amp, GpuMonitor, describe_gpu, free_gpu_memory, is_oom, resolve_device, seed_everything
from planner import TimePlanner


@dataclass
class Fold:
    """One fold's data, as the competition's `fold()` returns it."""

    index: int
    train: Any  # the training rows, in whatever form the competition's loader takes
    valid: Any
    y_valid: np.ndarray  # targets of the validation rows, in order (scored, written to the OOF file)
    ids_valid: np.ndarray
    extras: dict = field(default_factory=dict)  # saved beside the weights (a fitted preprocessor's state)


@dataclass
class Batching:
    """The one home of batch size, accumulation and LR; the probe and OOM recovery change them here."""

    size: int  # rows per forward/backward, per process
    accum_steps: int  # batches per optimizer step: effective batch = size x world x accum_steps
    lr: float  # peak LR for that effective batch
    parts: int = 1  # OOM recovery: each batch is split into this many micro-batches (doubles on OOM)
    world: int = field(default_factory=parallel.world_size)  # DDP ranks averaging their gradients
    eval_size: int = 0  # validation rows per forward, sized on its own by the probe; 0 = 2 x size

    def __post_init__(self):
        # train.py's LR rule saw one process's batch; under DDP the gradient averages `world` of
        # them, so the rule (hardware.scaled_lr's square root) is applied to the whole effective batch
        one = self.size * self.accum_steps
        self.lr *= hardware.scaled_lr(1.0, one * self.world) / hardware.scaled_lr(1.0, one)

    @property
    def effective(self) -> int:
        return self.size * self.accum_steps * self.world

    @property
    def eval_rows(self) -> int:
        """Validation batch: no gradients, so 2x the training batch unless the probe measured it."""
        return self.eval_size or self.size * 2


@dataclass
class Machine:
    """Where the run trains: device, precision and input pipeline, fixed for the whole run."""

    device: torch.device
    amp: Amp
    loader: dict  # DataLoader settings (workers, prefetch, pinning); tables: in-memory
    channels_last: bool  # NHWC inputs and weights (CNNs on CUDA)
    monitor: GpuMonitor
    cpus: int


def add_run_flags(p, gpu_profile: str, budget: str) -> None:
    """The flags every task's train.py shares: hardware, precision, the time budget, dry runs.
    argparse's own errors become one ERROR line too (errors.one_line_errors)."""
    one_line_errors(p)
    p.add_argument(
        "--gpu",
        default=gpu_profile,
        choices=[*sorted(hardware.PROFILES), "auto"],
        help="profile for the defaults; auto: this machine's card (one built from it if kagtpl does not list it)",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--amp",
        default="auto",
        choices=["auto", "bf16", "fp16", "fp32", "off"],
        help="auto: bf16 on compute capability >= 8, fp16 + GradScaler on T4/V100, off on CPU",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile: ~20%% faster steps, ~1 min to compile")
    # time budget: folds and epochs are cut to fit, prediction keeps a reserve (docs/time-budget.md)
    p.add_argument("--budget", default=budget, help="wall time for train + predict: 9h, 45m, 600s; '' = none")
    p.add_argument("--start-time", type=float, default=time_planner.PROCESS_START, help="budget start (run.py sets it)")
    p.add_argument("--dry-run", action="store_true", help="3 batches, 1 epoch, 2 folds: checks the whole path")
    # more than one GPU (docs/parallel.md): folds = one fold per GPU at a time; ddp = torchrun
    p.add_argument(
        "--parallel",
        default="auto",
        choices=parallel.MODES,
        help="auto: folds with 2+ GPUs and folds >= GPUs (Kaggle T4x2), ddp under torchrun, else none",
    )
    p.add_argument("--devices", default="", help="for --parallel folds: cuda:0,cuda:1 (default: every GPU); cpu,cpu")
    # tune.py's results and its trials (docs/tuning.md)
    p.add_argument(
        "--params", default="", help="tune.py's output/best_params.json: its values; flags you give still win"
    )
    p.add_argument("--train-folds", type=int, default=0, help="train only the first N folds of the split (0 = all)")
    p.add_argument(
        "--predict-reserve",
        type=float,
        default=-1,
        help="seconds of the budget kept for predict.py; -1 = the rule (15%% or the measured need); tune's trials: 0",
    )


def parse_args(p, argv=None):
    """argparse, then --params FILE: the file's values become the parser's defaults and the
    command line is read again, so a flag you give still wins over the file."""
    args = p.parse_args(argv)
    if args.params:
        p.set_defaults(**read_params(Path(args.params), p))
        args = p.parse_args(argv)
    return args


def read_params(path: Path, p) -> dict:
    """{flag dest: value} from tune.py's best_params.json ({"params": {...}, ...}), each key a flag
    of this script and each value of its flag's type (a choice among its choices); anything else
    is a RunError naming the file and the key, before anything runs."""
    try:
        params = json.loads(path.read_text()).get("params")
    except (OSError, ValueError, AttributeError) as e:
        raise RunError(f"--params {path}: cannot read it as tune.py's JSON ({e})") from None
    if not isinstance(params, dict):
        raise RunError(f'--params {path}: no "params" object (tune.py writes output/best_params.json)')
    flags = {a.dest: a for a in p._actions}
    for key, value in params.items():
        action = flags.get(key)
        if action is None or key in ("params", "help"):
            raise RunError(f"--params {path}: {key!r} is not a flag of {p.prog}")
        want = type(action.default) if action.type is None else action.type
        ok = isinstance(value, bool) if want is bool else not isinstance(value, bool)
        ok = ok and (isinstance(value, (int, float)) if want is float else isinstance(value, want))
        if not ok or (action.choices and value not in action.choices):
            raise RunError(f"--params {path}: {key} = {value!r} is not a valid --{key.replace('_', '-')}")
    return params


# Every numeric flag both tasks share, with its range: a value outside is one ERROR line before
# anything is read or written (--accum-steps -1 trained by gradient ascent; --folds 1 has no
# validation fold). train.py adds its own flags' ranges to these.
FLAG_RANGES = {
    "folds": (2, 100),
    "epochs": (1, 100_000),
    "patience": (1, 100_000),
    "lr": (0.0, 10.0),  # 0 freezes the weights (a check); below 0 is gradient ascent
    "weight_decay": (0.0, 10.0),
    "batch_size": (0, 65_536),  # 0 = the rule for the GPU
    "accum_steps": (0, 4096),  # 0 = the rule (tables: 1)
    "seed": (0, 2**32 - 1),  # numpy's seed range
    "train_folds": (0, 100),
    "predict_reserve": (-1, 10**7),
}


def check_flags(args, ranges: dict) -> None:
    """Each flag in `ranges` ({dest: (low, high)}) within its range (NaN and inf are not); else
    a RunError naming the flag, the value and the range. predict.py checks its flags with it too."""
    for name, (low, high) in ranges.items():
        value = getattr(args, name)
        if not low <= value <= high:
            raise RunError(f"--{name.replace('_', '-')} {value}: must be from {low} to {high}")


def check_folds(folds: int, path, rows: int, class_counts: dict | None = None) -> None:
    """Enough rows, and enough of every class, for `folds` stratified folds: the DataError names
    the class and the largest --folds the data allows (instead of sklearn's traceback)."""
    if rows < folds:
        raise DataError(f"{path}: {rows} rows cannot make --folds {folds}; use --folds {max(2, rows)} or fewer")
    if class_counts:
        label, n = min(class_counts.items(), key=lambda kv: kv[1])
        if n < folds:
            way_out = f"use --folds {n} or fewer, or" if n >= 2 else "2 folds need 2 rows of it:"
            raise DataError(
                f"{path}: class {label!r} has {n} row(s), fewer than --folds {folds}: every fold needs one to "
                f"validate it; {way_out} merge or drop that class's rows"
            )


def begin(args, ranges: dict | None = None) -> torch.device:
    """A run's first step: the flags checked (FLAG_RANGES plus the task's `ranges`), --dry-run's
    small plan, the output folder (locked against a second train.py, stale temp files of killed
    runs swept), the seed, the device."""
    check_flags(args, {**FLAG_RANGES, **(ranges or {})})
    try:
        time_planner.parse_duration(args.budget)
    except ValueError as e:
        raise RunError(f"--budget: {e}") from None
    if args.dry_run:
        args.epochs, args.folds = 1, 2
    device = resolve_device(args.device)  # a card this torch has no kernels for: ERROR before anything is written
    out = Path(args.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"--out-dir {out}: cannot create it ({e.strerror})") from None
    worker = parallel.fold_worker()
    if worker:  # started by a --parallel folds train.py, which holds the lock and swept the folder
        args.parallel, why = "folds", f"worker {worker[0] + 1} of {worker[1]} on {device.type}: the next free fold"
    else:
        args.parallel, why = parallel.choose(args.parallel, parallel.devices_for(args.devices, device), args.folds)
    if args.parallel == "ddp":
        device = parallel.start_ddp(device.type)
        why += f"; rank {parallel.rank()} of {parallel.world_size()}"
        if not parallel.writes():  # one log: rank 0's (errors still reach stderr)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    if parallel.writes() and not worker:
        storage.lock_output(out)
        storage.sweep_stale_tmp(out)
    print(f"PARALLEL: {args.parallel} ({why})")
    seed_everything(args.seed)
    return device


def profile(gpu_flag: str, device: torch.device) -> hardware.Profile:
    """The profile every rule reads (batch, workers, text max_len and checkpointing). On CUDA the
    detected card wins over --gpu (the project's rendered profile): a project rendered for an A100
    and run on a T4 takes the T4's rules, with a WARNING line naming both. An unlisted card gets a
    profile built from its memory and compute capability. On CPU: the cpu profile."""
    if device.type != "cuda":
        if gpu_flag not in ("auto", "cpu"):  # the a10 batch on a CPU: 23 GB, killed
            print(f"WARNING: --gpu {gpu_flag} but training on {device.type}: batch and workers follow the CPU profile")
        return hardware.PROFILES["cpu"]
    name, total_gb, capability = describe_gpu(device)
    found, warning = hardware.profile_for(name, total_gb, capability, hardware.usable_cpus())
    if warning:
        print(f"WARNING: {warning}")
    wanted = hardware.PROFILES.get(gpu_flag)
    same = wanted is not None and (wanted.memory_gb, wanted.capability) == (found.memory_gb, found.capability)
    if wanted is not None and not same:
        print(
            f"WARNING: --gpu {gpu_flag} ({wanted.label}, {wanted.memory_gb:g} GB) but this card is {name} "
            f"({total_gb:.0f} GB, compute capability {capability[0]}.{capability[1]}): its rules are used"
        )
    return found


def make_planner(args, machine: Machine) -> TimePlanner:
    """The run's time planner (planner.py), timing real steps: CUDA is synchronised before each reading."""
    sync = torch.cuda.synchronize if machine.device.type == "cuda" else None
    folds = min(args.folds, args.train_folds or args.folds)  # --train-folds 1: fold 0 only (tune.py's trials)
    planner = time_planner.make_planner(args.budget, args.start_time, folds, args.epochs, sync)
    if args.predict_reserve >= 0:
        planner.fixed_reserve = args.predict_reserve
    worker = parallel.fold_worker()
    planner.parallel = worker[1] if worker else 1  # the folds left are shared by this many workers
    return planner


def make_machine(device: torch.device, amp_flag: str, loader: dict, channels_last: bool) -> Machine:
    """Precision from --amp (gpu.training_amp: auto is bf16 on compute capability >= 8, fp16 +
    GradScaler on T4/V100; bf16 asked for on a T4/V100 becomes fp16 with a warning)."""
    capability = describe_gpu(device)[2]
    mode, warning = gpu.training_amp(amp_flag, capability)
    if warning and device.type == "cuda":
        print(f"WARNING: {warning}")
    return machine_for(device, mode, loader, channels_last)


def inference_machine(device: torch.device, checkpoints: list, loader: dict, channels_last: bool) -> Machine:
    """predict.py's machine for the ensemble's [(path, checkpoint)]: the precision they were trained
    with where this device runs it, else fp32 (gpu.inference_amp; folds trained in different
    precisions, a resume with another --amp: fp32), printed as a PRECISION: line."""
    trained = {ckpt["config"].get("amp") for _, ckpt in checkpoints}
    mode, why = gpu.inference_amp(trained.pop() if len(trained) == 1 else "mixed", describe_gpu(device)[2])
    print(f"PRECISION: {mode} ({why})")
    return machine_for(device, mode, loader, channels_last)


def machine_for(device: torch.device, mode: str, loader: dict, channels_last: bool) -> Machine:
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: autotune the conv kernels once
    on_cuda = device.type == "cuda"
    return Machine(
        device, Amp(mode, device), loader, on_cuda and channels_last, GpuMonitor(device), hardware.usable_cpus()
    )


def can_compile(device: torch.device) -> tuple[bool, str]:
    """torch.compile's GPU code is Triton's, which needs compute capability >= 7.0 (a P100 fails
    inside Triton at the first step)."""
    capability = describe_gpu(device)[2]
    if device.type == "cuda" and capability < (7, 0):
        return (
            False,
            f"--compile needs compute capability >= 7.0 (Triton); this card has {capability[0]}.{capability[1]}",
        )
    return True, ""


def print_start(machine: Machine, batching: Batching, why: str) -> None:
    """The RESOURCES / GPU Memory / DataLoader / BATCH lines every run starts with."""
    name, total_gb, _ = describe_gpu(machine.device)
    lines = logs.resource_lines(machine.cpus, batching.size, name, machine.amp.enabled, total_gb, machine.loader)
    print(*lines, sep="\n")
    print(logs.batch_line(batching.size, batching.accum_steps, why, batching.world))


def batch_set_by_user(args) -> bool:
    """--batch-size or --accum-steps given: neither the small-data shrink nor the probe touches them."""
    return bool(args.batch_size or getattr(args, "accum_steps", 0))


def fit_steps(batching: Batching, rows: int, base_lr: float) -> None:
    """Small data: shrink accumulation, then the batch, so an epoch of `rows` keeps at least
    hardware.MIN_STEPS_PER_EPOCH optimizer steps (3 steps an epoch do not train); the LR follows
    the one rule (hardware.scaled_lr)."""
    rows //= batching.world  # under DDP each rank steps through its share
    batch, accum = hardware.fit_to_steps(batching.size, batching.accum_steps, rows)
    if (batch, accum) == (batching.size, batching.accum_steps):
        return
    batching.size, batching.accum_steps = batch, accum
    batching.lr = hardware.scaled_lr(base_lr, batching.effective)
    why = f"small data: {rows} training rows, at least {hardware.MIN_STEPS_PER_EPOCH} optimizer steps an epoch"
    print(logs.batch_line(batch, accum, f"{why}; lr {batching.lr:.2e}", batching.world))


def checkpoint_config(args, machine: Machine, batching: Batching) -> dict:
    """The resolved config saved in every checkpoint: the flags, with the batch, accumulation and
    LR actually used (after the probe) and the precision; predict.py rebuilds the model from it."""
    used = {"batch_size": batching.size, "accum_steps": batching.accum_steps, "lr": batching.lr}
    return {**vars(args), **used, "amp": machine.amp.mode, "channels_last": machine.channels_last}


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


# ----------------------------------------------------------------------------- cross-validation


def cross_validate(comp, splits, args, machine: Machine, batching: Batching, planner: TimePlanner) -> dict:
    """Train every fold the plan allows, then score the OOF predictions. Returns the OOF scores.

    `splits` is an iterable of (train indices, validation indices), e.g. StratifiedKFold's.
    `args` carries the run flags the engine reads: out_dir, epochs, patience, weight_decay,
    compile, autoscale (CUDA only), dry_run, parallel and the config saved with each checkpoint.
    With --parallel folds this process starts one worker per device (parallel.py), which train
    the folds; it then scores them and writes the report, as a sequential run does.
    """
    out = Path(args.out_dir)
    run_id = os.environ.get(parallel.RUN_ID_ENV) or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    # rank 0 alone writes the JSON log (the other ranks keep their records in memory)
    jlog = logs.JsonLog(out / "train_log.jsonl" if parallel.writes() else None, run_id, bool(args.dry_run))
    worker, lost = parallel.fold_worker(), []
    if args.parallel == "folds" and worker is None:
        trained, lost = train_on_workers(comp, args, machine, batching, planner, run_id)
        jlog.records = logs.read_records(jlog.path, run_id)
    else:
        trained = train_folds(comp, splits, args, machine, batching, planner, jlog)
    if worker or not parallel.writes():  # the parent train.py (or rank 0) scores and reports
        if worker and planner.stop_reason:
            print(logs.stopped_line(planner.stop_reason))
        parallel.finish_ddp()
        return {}
    scores = finish(comp, args, machine, batching, planner, jlog, trained)
    for watcher in _WATCHERS:
        watcher.stopped(planner.stop_reason)
    parallel.finish_ddp()
    if lost:
        raise RunError("; ".join(lost) + ": rerun train.py to train the lost fold(s) (finished ones are skipped)")
    return scores


def train_folds(comp, splits, args, machine: Machine, batching: Batching, planner: TimePlanner, jlog) -> list[int]:
    """The fold loop of one process. A fold worker takes only the folds no other worker has
    (parallel.FoldQueue) and keeps the plan's fold count shared; under DDP every rank runs
    every fold, with the plan agreed. Returns the folds trained or found complete."""
    out, queue = Path(args.out_dir), None
    if parallel.fold_worker():
        queue = parallel.FoldQueue(out / ".folds")
    trained = []
    for k, (trn_idx, val_idx) in enumerate(splits):
        if queue is not None:
            planner.folds = queue.cap(planner.folds)
        if parallel.agree_plan(planner, machine.device) or k >= planner.folds:
            break
        if queue is not None and not queue.take(k):
            continue  # another worker has it (to train, or found complete)
        path = out / f"model_fold{k}.pth"
        done = storage.fold_is_done(path, checkpoint_config(args, machine, batching), comp.resume_keys)
        print(f"FOLD {k} ({k + 1} of {planner.folds}): {len(trn_idx)} train, {len(val_idx)} valid")
        if done:
            print(f"FOLD {k}: {path.name} is complete, skipping (resume)")
        else:
            first = not planner.epoch_s  # the first fold this process trains: probe, Model line, estimate
            planner.begin_fold(k)
            fold = comp.fold(k, trn_idx, val_idx)
            best = train_fold(comp, fold, len(trn_idx), args, machine, batching, planner, jlog, first)
            planner.end_fold(k, first)
            print(f"FOLD {k} DONE: best val loss {best:.4f}, {planner.elapsed():.0f}s elapsed")
            parallel.barrier()  # rank 0 has written the fold's files before any rank looks for them
        trained.append(k)
    return trained


def train_on_workers(comp, args, machine, batching, planner, run_id: str) -> tuple[list[int], list[str]]:
    """--parallel folds: one worker per device trains folds from a shared queue; returns the
    folds to score (taken by a worker this run, or complete from an earlier one) and a line for
    each worker that died (its current fold is lost; the others go on)."""
    out, devices = Path(args.out_dir), parallel.devices_for(args.devices, machine.device)
    start = time.time() - planner.elapsed()  # one deadline for every worker
    result = parallel.run_fold_workers(devices, planner.folds, run_id, out, start, planner)
    config = checkpoint_config(args, machine, batching)
    done = {
        k for k in range(result["cap"]) if storage.fold_is_done(out / f"model_fold{k}.pth", config, comp.resume_keys)
    }
    forwarded = planner.stop_reason == "SIGTERM"  # a worker that exited on the forwarded signal saved its fold
    lost = [
        f"fold worker {tag} exited {code}, fold(s) {folds or 'none'} lost"
        for tag, code, folds in result["failed"]
        if not (forwarded and code == -signal.SIGTERM)
    ]
    return sorted(done | set(result["claims"])), lost


def finish(comp, args, machine: Machine, batching: Batching, planner: TimePlanner, jlog, trained: list[int]) -> dict:
    """After the folds: oof.csv and the OOF line, the report picture, the experiments row, DONE."""
    out = Path(args.out_dir)
    scores, fold_scores = oof_scores(comp, out, trained)
    where = describe_gpu(machine.device)[0] if machine.device.type == "cuda" else "CPU"
    logs.write_report(jlog.records, out / "train_report.png", f"{comp.name} on {where}")
    experiments.append(
        out / "experiments.csv",
        {
            "git": experiments.git_commit(),
            **comp.describe,
            "model": comp.name,
            "batch": f"{batching.size}x{batching.accum_steps}",
            "lr": f"{batching.lr:.2e}",
            "folds_planned": args.folds,
            "folds_done": len(fold_scores),
            "epochs_planned": args.epochs,
            "epochs_done": " ".join(str(sum(r["fold"] == k for r in jlog.records)) for k in trained),
            "metric": comp.metric_name,
            "higher_is_better": comp.higher_is_better,
            "cv": f"{list(scores.values())[-1]:.5f}" if scores else "",
            "fold_scores": " ".join(f"{s:.4f}" for s in fold_scores),
            "wall_s": f"{planner.elapsed():.0f}",
            "stop": planner.stop_reason or ("dry run" if args.dry_run else "done"),
        },
    )
    if planner.stop_reason:
        print(logs.stopped_line(planner.stop_reason))
    print(f"DONE: {len(trained)} folds in {planner.elapsed():.1f}s; next: python predict.py")
    return scores


def train_fold(comp, fold: Fold, n_train, args, machine, batching, planner, jlog, first: bool) -> float:
    """Train one fold and keep its best epoch in model_fold{k}.pth; returns its best val loss."""
    out, monitor, k = Path(args.out_dir), machine.monitor, fold.index
    ckpt_path = out / f"model_fold{k}.pth"

    t_model = time.time()
    model = comp.build_model(fold).to(machine.device)
    model_s = time.time() - t_model  # predict.py builds one model per fold: part of the reserve
    if machine.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if first:
        print(logs.model_line(comp.name, sum(p.numel() for p in model.parameters()) / 1e6))
    optimizer = make_optimizer(comp, model, batching.lr, args.weight_decay)
    if first and getattr(args, "autoscale", False) and machine.device.type == "cuda":
        if batch_set_by_user(args):  # the user's numbers are kept as given
            print(f"BATCH PROBE: skipped: --batch-size {args.batch_size} / --accum-steps {args.accum_steps} set by you")
        else:  # per GPU, on the bare model (no all-reduce); under DDP every rank takes the smallest batch
            autoscale(comp, fold, n_train // batching.world, model, optimizer, machine, batching, args.lr)
            agree_batching(batching, args.lr, machine.device, optimizer)
    bare = model  # validation runs on the module itself: DDP's forward holds collectives
    model = parallel.wrap(model, machine.device)  # DDP: rank 0's weights broadcast to every rank
    grads = parallel.GradSync(model, machine.device)  # DDP: local backward, OOM agreed, one all-reduce
    if args.compile:
        ok, why = can_compile(machine.device)
        if ok:
            model = torch.compile(model)
        elif first:
            print(f"WARNING: {why}: running without it")

    train_sampler = parallel.sampler(fold.train, train=True, seed=args.seed)  # None without DDP
    train_batches = loader(comp, fold.train, batching.size, True, train_sampler)
    valid_sampler = parallel.sampler(fold.valid, train=False, seed=args.seed)
    valid_batches = loader(comp, fold.valid, batching.eval_rows, False, valid_sampler)  # sized on its own
    n_batches = min(len(train_batches), 3 if args.dry_run else len(train_batches))
    scheduler = warmup_cosine(optimizer, math.ceil(n_batches / batching.accum_steps), lambda: planner.epochs)

    def batch_loss(batch):
        return comp.batch_loss(model, to_device(batch, machine))

    def first_step():
        monitor.measure_outside()  # cuBLAS/cuDNN handles exist after the first real step
        print(*logs.memory_used_lines(monitor.peak(), batching.size), sep="\n")

    best, bad_epochs, saved, last_peak = math.inf, 0, False, None
    on_first_step = first_step if first else None

    def save(epoch: int, **meta) -> None:
        if not parallel.writes():
            return
        config = checkpoint_config(args, machine, batching)
        run = {key: config.get(key) for key in comp.resume_keys}  # what makes folds of one ensemble
        storage.save_checkpoint(
            ckpt_path,
            model,
            config,
            comp.classes,
            fold=k,
            epoch=epoch,
            run=run,
            saved_at=time.time(),
            **meta,
            **fold.extras,
        )

    def should_stop(i: int) -> bool:
        planner.tick(i)
        return parallel.agree_plan(planner, machine.device)  # DDP: one decision for every rank

    for epoch in range(1, args.epochs + 1):
        planner.can_start_epoch()  # the deadline guard: sets stop_reason when the epoch would not fit
        if parallel.agree_plan(planner, machine.device) or epoch > planner.epochs:
            break
        monitor.reset()
        planner.begin_epoch(n_batches, len(valid_batches))
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        t0 = time.time()
        model.train()
        train_loss, seen = run_epoch(
            train_batches,
            n_batches,
            batch_loss,
            optimizer,
            scheduler,
            machine.amp,
            batching,
            on_first_step,
            should_stop,
            grads,
        )
        train_time, on_first_step = time.time() - t0, None
        grads.sync_buffers()  # DDP: validate rank 0's BatchNorm statistics, the ones saved
        train_loss, seen = parallel.mean(train_loss, machine.device), seen * batching.world
        if parallel.agree_plan(planner, machine.device):  # deadline or SIGTERM mid-epoch: no time to validate
            if not saved:  # better an unvalidated model than no submission
                save(epoch, complete=False)
            print(f"STOPPED: fold {k} epoch {epoch} ({planner.stop_reason}); best checkpoint kept")
            break

        pred = predict(comp.predict, bare, valid_batches, machine, max_batches=2 if args.dry_run else None)
        if epoch == 1:  # validation speed -> the prediction estimate -> the reserve
            valid_s = time.time() - t0 - train_time
            planner.note_inference(valid_s, len(pred), comp.test_rows, comp.test_views, comp.decode_s, model_s)
        pred = parallel.gather_rows(pred, len(fold.y_valid), machine.device)  # DDP: every rank's share, in order
        planner.end_epoch(epoch)
        y = fold.y_valid[: len(pred)]
        val_loss, metric = evaluate(comp, y, pred, f"fold {k} epoch {epoch}")
        stats = {
            "train_loss": train_loss,
            "val_loss": val_loss,
            "metric": metric,
            "lr": scheduler.get_last_lr()[0],
            "time_s": time.time() - t0,
            "samples_per_s": seen / max(train_time, 1e-9),
        }
        print(logs.epoch_line(epoch, stats, comp.metric_name, monitor.field()))
        print(planner.status_line())
        if reason := tell_watchers(k, epoch, val_loss, metric):  # tune.py: optuna pruned the trial
            planner.request_stop(reason)
        peak = monitor.peak()
        if drop := logs.memory_drop_line(last_peak, peak):
            print(drop)
        last_peak = peak
        jlog.write(
            fold=k,
            epoch=epoch,
            **stats,
            batch_size=batching.size,
            accum_steps=batching.accum_steps,
            gpu_used_gb=peak and peak[0],
            gpu_pct=peak and peak[2],
            elapsed_s=planner.elapsed(),
            metric_name=comp.metric_name,
        )

        if val_loss < best:
            best, bad_epochs, saved = val_loss, 0, True
            save(epoch, val_loss=best, complete=False)
            if parallel.writes():
                write_oof(comp, fold, y, pred, out / f"oof_fold{k}.csv")
        else:
            bad_epochs += 1
            if bad_epochs >= args.patience:
                print(f"EARLY STOP: fold {k} epoch {epoch}, no better val loss for {args.patience} epochs")
                break
    parallel.check_in_sync(model, machine.device)
    if planner.stop_reason is None and parallel.writes() and not storage.mark_complete(ckpt_path):
        print(f"WARNING: fold {k} never produced a finite val loss; no checkpoint written")
    return best


def make_optimizer(comp, model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the competition's parameter groups when it has them (`param_groups(model)`:
    dicts of params with an `lr_scale`, e.g. layer-wise LR decay), else over every parameter."""
    groups = comp.param_groups(model) if hasattr(comp, "param_groups") else [{"params": list(model.parameters())}]
    for group in groups:
        group.setdefault("lr_scale", 1.0)
        group["lr"] = lr * group["lr_scale"]
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


def set_lr(optimizer, lr: float) -> None:
    """The run's peak LR changed (batch probe, DDP agreement): every group follows, at its own scale."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def fixed_folds(out: Path, ids, y, k: int, seed: int, stratify: bool) -> tuple[list, str]:
    """The project's folds, made once and reused by every model and every later run, so their OOF
    scores compare and their OOF sets blend: output/folds-k{k}-seed{seed}.csv (id, fold). Another
    --folds or --seed is another file, never an overwrite; a file whose ids are not train.csv's
    is a DataError. Returns the (train, validation) index pairs and the file's name."""
    from sklearn.model_selection import KFold, StratifiedKFold

    path = Path(out) / f"folds-k{k}-seed{seed}.csv"
    ids = np.asarray(ids).astype(str)
    if path.is_file():
        saved = pd.read_csv(path, dtype={"id": str})
        fold_of = dict(zip(saved["id"], saved["fold"], strict=True))
        if len(saved) != len(ids) or not all(i in fold_of for i in ids):
            raise DataError(f"{path}: made for another train.csv (its ids differ); move it away to make new folds")
        folds = np.array([fold_of[i] for i in ids])
        print(f"FOLDS: {path.name} reused ({k} folds, seed {seed}): every model and run is scored on the same rows")
    else:
        split = (StratifiedKFold if stratify else KFold)(n_splits=k, shuffle=True, random_state=seed)
        folds = np.empty(len(ids), np.int64)
        for f, (_, val_idx) in enumerate(split.split(ids, y)):
            folds[val_idx] = f
        storage.write_csv_atomic(pd.DataFrame({"id": ids, "fold": folds}), path)
        print(f"FOLDS: {path.name} written ({k} folds, seed {seed}); later runs and models reuse it")
    return [(np.flatnonzero(folds != f), np.flatnonzero(folds == f)) for f in range(k)], path.name


def copy_oof(out: Path, source: str, name: str) -> None:
    """A model's OOF file under the blend's name (oof_<model>.csv), when the run wrote one."""
    if (Path(out) / source).is_file() and parallel.writes() and not parallel.fold_worker():
        storage.write_csv_atomic(pd.read_csv(Path(out) / source), Path(out) / name)


def write_oof(comp, fold: Fold, y: np.ndarray, pred: np.ndarray, path: Path) -> None:
    """The fold's validation predictions beside their ids and targets (oof_fold{k}.csv)."""
    oof = pd.DataFrame({comp.id_col: fold.ids_valid[: len(pred)], "fold": fold.index, **target_columns(y)})
    oof[comp.oof_columns] = np.asarray(pred).reshape(len(pred), -1)
    storage.write_csv_atomic(oof, path)


def loader(comp, rows, batch: int, train: bool, sampler):
    """The competition's batches; under DDP with this rank's DistributedSampler."""
    if sampler is None:
        return comp.loader(rows, batch, train)
    return comp.loader(rows, batch, train, sampler=sampler)


def agree_batching(batching: Batching, base_lr: float, device, optimizer) -> None:
    """DDP: every rank probed its own GPU; all take the smallest batch (the fullest GPU decides)
    and the most accumulation, so the steps stay in lockstep and fit everywhere."""
    if batching.world == 1:
        return
    batching.size = parallel.smallest(batching.size, device)
    batching.accum_steps = -parallel.smallest(-batching.accum_steps, device)
    if batching.eval_size:
        batching.eval_size = parallel.smallest(batching.eval_size, device)
    batching.lr = hardware.scaled_lr(base_lr, batching.effective)
    set_lr(optimizer, batching.lr)


def evaluate(comp, y: np.ndarray, pred: np.ndarray, where: str) -> tuple[float, float]:
    """(val loss, metric) of one validation pass. Non-finite predictions (a diverged model: NaN
    weights) score inf / NaN with a warning instead of crashing the metric: that epoch is never
    the best one, so it is never saved."""
    if not np.isfinite(pred).all():
        print(f"WARNING: {where}: the model's predictions are not finite (training diverged: lower --lr)")
        return math.inf, math.nan
    return comp.val_loss(y, pred), list(comp.score(y, pred).values())[-1]


def oof_scores(comp, out: Path, folds: list[int]) -> tuple[dict, list[float]]:
    """oof.csv from the folds' OOF files, the OOF line, and the metric per fold."""
    oofs = [pd.read_csv(out / f"oof_fold{k}.csv") for k in folds if (out / f"oof_fold{k}.csv").exists()]
    if not oofs:
        return {}, []
    oof = pd.concat(oofs, ignore_index=True)
    storage.write_csv_atomic(oof, out / "oof.csv")
    scores = comp.score(read_targets(oof), oof[comp.oof_columns].to_numpy())
    print(logs.oof_line(scores, len(oof), sorted(set(oof["fold"]))))
    per_fold = [list(comp.score(read_targets(f), f[comp.oof_columns].to_numpy()).values())[-1] for f in oofs]
    return scores, per_fold


def target_columns(y: np.ndarray) -> dict:
    """The OOF file's target: one `target` column, or target_0.. for several (multi-label, several scores)."""
    if y.ndim == 1:
        return {"target": y}
    return {f"target_{j}": y[:, j] for j in range(y.shape[1])}


def read_targets(oof: pd.DataFrame) -> np.ndarray:
    if "target" in oof.columns:
        return oof["target"].to_numpy()
    return oof[[c for c in oof.columns if c.startswith("target_")]].to_numpy()


# ----------------------------------------------------------------------------- one epoch


def to_device(batch, machine: Machine):
    """A batch (a tensor or a tuple of them) on the device; 4-D inputs (uint8 images too) as NHWC when
    channels_last, so the model's NHWC weights meet NHWC activations."""
    if isinstance(batch, torch.Tensor):
        if machine.channels_last and batch.dim() == 4:
            return batch.to(machine.device, non_blocking=True, memory_format=torch.channels_last)
        return batch.to(machine.device, non_blocking=True)
    return type(batch)(to_device(b, machine) for b in batch)


@torch.no_grad()
def predict(predict_fn, model, batches, machine: Machine, max_batches=None) -> np.ndarray:
    """predict_fn(model, batch) for every batch, in order: validation here, the test set in predict.py.
    Outputs stay on the device until the end (one copy back, one sync). A batch that runs out of
    memory is predicted in halves (then quarters, ...), and the rest of the batches at that size."""
    model.eval()
    out, parts = [], 1
    for i, batch in enumerate(batches):
        if max_batches is not None and i >= max_batches:
            break
        batch = to_device(batch, machine)
        while True:
            try:
                with machine.amp.autocast():
                    pieces = split_batch(batch, parts) if parts > 1 else [batch]
                    done = [predict_fn(model, piece).float() for piece in pieces]
                out += done
                break
            except RuntimeError as e:  # gpu.OutOfMemoryError is one
                if not is_oom(e) or parts * 2 > batch_rows(batch):
                    raise
                free_gpu_memory()
                parts *= 2
    return torch.cat(out).cpu().numpy()


def run_epoch(
    batches, n, batch_loss, optimizer, scheduler, amp, batching, on_first_step=None, should_stop=None, grads=None
):
    """One training pass over the first `n` of `batches` with gradient accumulation.

    `batch_loss(batch)` is the competition code: it returns (mean loss, rows) under autocast.
    Each accumulation group's loss is divided by the group's own size, so a last partial group
    steps the optimizer too, with a correctly scaled gradient.

    Out of GPU memory anywhere in a group (forward, backward, optimizer.step, or a cuDNN/cuBLAS
    allocation failure) is one recovery: the group's gradients and the GradScaler's step state
    are dropped, memory is freed, and the group's batches are redone as 2 (then 4, ...)
    micro-batches each: the micro-batch halves, the accumulation doubles, the effective batch
    stays. The halved micro-batch is made permanent (`batching.parts`, kept for later epochs
    and folds) only once it has carried a whole group through its optimizer step.

    Under DDP (`grads`, parallel.GradSync) every backward is local (no_sync) and every rank
    votes after each batch whether it ran out of memory: if any did, every rank drops the group
    and splits alike, so the ranks' collectives stay matched; the group's gradients are then
    averaged in one bucketed all-reduce before the optimizer step.
    `on_first_step()` runs once after the first optimizer step (the GPU memory lines);
    `should_stop(i)` is asked after every batch (the time budget's deadline, SIGTERM).
    Returns (mean loss, samples seen).
    """
    grads = grads or parallel.GradSync(None, None)
    accum, parts = batching.accum_steps, batching.parts
    total, seen = None, 0
    group, group_stats = [], []  # this group's batches (kept to redo it after an OOM) and their (loss x rows, rows)
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(batches):
        if i >= n:
            break
        group_size = min(accum, n - (i // accum) * accum)
        closes = (i + 1) % accum == 0 or i + 1 == n
        group.append(batch)
        todo = [batch]
        while True:
            try:
                stats = grads.agreed(_backward_all, todo, batch_loss, amp, group_size, parts, grads)
                if closes:
                    grads.reduce()
                    grads.agreed(amp.step, optimizer, after_step=True)
                break
            except RuntimeError as e:  # gpu.OutOfMemoryError is one; under DDP, any rank's
                if not is_oom(e):
                    raise
                optimizer.zero_grad(set_to_none=True)  # the group's partial gradients are dropped...
                amp.forget_step(optimizer)  # ...and so is the scaler's record of unscaling them
                free_gpu_memory()
                rows = batch_rows(batch)
                if parts * 2 > rows:
                    raise
                print(
                    f"OOM: batch of {rows} did not fit at step {i}: micro-batch {-(-rows // parts)} -> "
                    f"{-(-rows // (2 * parts))}, accumulation {accum * parts} -> {accum * parts * 2}, "
                    f"effective batch {rows * accum} unchanged" + grads.oom_note(),
                    flush=True,
                )
                parts, todo, group_stats = parts * 2, list(group), []  # redo the whole group, halved
        group_stats += stats
        if closes:
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            batching.parts = parts  # the micro-batch that carried this group through its step
            if on_first_step is not None:
                on_first_step()
                on_first_step = None
        stop = should_stop is not None and should_stop(i)
        if closes or stop:
            for loss_x_rows, rows in group_stats:  # on the device: no .item() sync
                total = loss_x_rows if total is None else total + loss_x_rows
                seen += rows
            group, group_stats = [], []
        if stop:
            break
    return (0.0 if total is None else (total / max(seen, 1)).item()), seen


def batch_rows(batch) -> int:
    return len(batch) if isinstance(batch, torch.Tensor) else batch_rows(batch[0])


def split_batch(batch, parts: int) -> list:
    """A batch (a tensor, or a tuple/list of them) cut into `parts` pieces along the rows."""
    if isinstance(batch, torch.Tensor):
        return list(torch.tensor_split(batch, parts))
    pieces = [split_batch(b, parts) for b in batch]
    return [type(batch)(p[k] for p in pieces) for k in range(parts)]


def _backward_all(batches, batch_loss, amp, group: int, parts: int, grads) -> list:
    return [_backward(b, batch_loss, amp, group, parts, grads) for b in batches]


def _backward(batch, batch_loss, amp, group: int, parts: int, grads):
    """Backward of one batch, as `parts` micro-batches whose gradients add up to the batch's
    (local under DDP: grads.local() is no_sync). Returns (loss x rows, rows) for the epoch's mean loss."""
    rows, loss_sum, size_sum = batch_rows(batch), None, 0
    for piece in split_batch(batch, parts) if parts > 1 else [batch]:
        with grads.local():
            with amp.autocast():
                loss, size = batch_loss(piece)
            amp.backward(loss * (size / rows) / group)
        part = loss.detach().float() * size
        loss_sum, size_sum = (part if loss_sum is None else loss_sum + part), size_sum + size
    return loss_sum, size_sum


def warmup_cosine(optimizer, steps_per_epoch: int, epochs):
    """Linear warm-up over the first 5% of optimizer steps, then cosine decay to zero.
    `epochs()` is read at every step: when the time plan cuts epochs, the decay ends sooner."""

    def factor(step: int) -> float:
        total = max(1, steps_per_epoch * epochs())
        warmup = max(1, int(total * 0.05))
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ----------------------------------------------------------------------------- the batch probe hook


def autoscale(
    comp, fold: Fold, n_train: int, model, optimizer, machine: Machine, batching: Batching, base_lr, clock=None
) -> None:
    """Before the first fold, on CUDA, unless --batch-size or --accum-steps were given: time real
    training steps at growing batch sizes (gpu.probe_batch) and keep the smallest batch within 5%
    of the best samples/s under the memory ceiling; then size the validation batch on its own
    (gpu.probe_eval_batch). The result is written to `batching` (and the optimizer's LR). `clock`
    is the probe's timer (time.perf_counter; the tests' fake GPU passes its own)."""

    def fetch(b: int):  # one batch from the project's own loader, on the device (outside the timer)
        return to_device(next(iter(comp.loader(fold.train, b, train=True))), machine)

    def step(batch) -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with machine.amp.autocast():
            loss, _ = comp.batch_loss(model, batch)
        machine.amp.backward(loss)
        machine.amp.step(optimizer)

    @torch.no_grad()
    def forward(batch) -> None:
        model.eval()
        with machine.amp.autocast():
            comp.predict(model, batch)

    size_class = hardware.size_class(comp.name, sum(p.numel() for p in model.parameters()) / 1e6)
    max_batch = max(batching.size, min(4096, n_train // hardware.MIN_STEPS_PER_EPOCH))  # enough steps an epoch
    batching.size, batching.accum_steps, batching.lr = gpu.probe_batch(
        fetch,
        step,
        model,
        optimizer,
        machine.amp,
        batching.size,
        batching.accum_steps,
        size_class,
        machine.monitor,
        max_batch,
        lambda effective: hardware.scaled_lr(base_lr, effective),
        clock=clock,
    )
    set_lr(optimizer, batching.lr)
    batching.eval_size = gpu.probe_eval_batch(fetch, forward, batching.size, machine.monitor)
    model.train()


# ----------------------------------------------------------------------------- in-memory tables


class TensorBatches:
    """Batches of rows of tensors already on the device (a whole table in memory): each batch
    is a gather by a slice of a permutation made on the device; no per-row Dataset or collate.
    Yields tuples of the tensors' rows; `len()` is the number of batches."""

    def __init__(self, tensors: tuple, batch: int, shuffle: bool, drop_last: bool, sampler=None):
        self.tensors, self.batch, self.shuffle, self.sampler = tensors, batch, shuffle, sampler
        n = len(sampler) if sampler is not None else len(tensors[0])  # DDP: this rank's share
        self.drop_last = drop_last and n >= batch  # a table smaller than a batch still gives one
        self.n = n

    def __len__(self) -> int:
        return self.n // self.batch if self.drop_last else math.ceil(self.n / self.batch)

    def __iter__(self):
        device = self.tensors[0].device
        if self.sampler is not None:
            order = torch.as_tensor(list(self.sampler), device=device)
        elif self.shuffle:
            order = torch.randperm(self.n, device=device)
        else:
            order = torch.arange(self.n, device=device)
        for i in range(len(self)):
            idx = order[i * self.batch : (i + 1) * self.batch]
            yield tuple(t[idx] for t in self.tensors)
