"""The run flags every task's train.py shares, `--params` (tune.py's best_params.json), the
flag ranges, the folds check and `begin`: a run's first step before any data is read.

It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from . import artifacts, hardware, locks, logs, parallel, room
from . import planner as time_planner
from .errors import DataError, RunError, one_line_errors
from .gpu import resolve_device, seed_everything
from .machine import can_compile
from .reserve import PredictionReserve

BUDGET_HELP = (
    "wall time for train + predict: 9h, 45m, 600s; '' = none. Growth (more seeds, TTA views) needs it given "
    "here or by run.py: the project's default alone is a limit, not time to fill"
)


class Given(argparse.Action):
    """A flag, and whether it was given (args.<flag>_given; set_defaults gives False). --budget:
    growth fills a budget someone chose for this run, never the project's default (plain `python
    train.py` on a 1,200-row table of a T4 project grew into its 9 h default: 7.5 minutes and 372
    files in output/). --model: a model you name is trained as named, even from scratch."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


COMPILE_HELP = (
    "torch.compile: 17%% more img/s (resnet50, H100) after ~90 s of compiling; auto: where each fold trains 20x "
    "that long (a 9h Kaggle budget), compiled steps are timed against eager ones before the first epoch and the "
    "faster kept (off for dry runs, short budgets, tune.py's trials and CPUs); on: compiled whatever it measures; "
    "a compile that fails trains eager with a WARNING"
)
CUDNN_HELP = "cuDNN autotunes every conv shape: up to 60 s per process on an H100 and no faster steps measured (off)"
NO_GROW_HELP = "a plan that fits ends early (default: more seeds; KAGTPL_GROW=off makes this the default)"
HAND_IN = ("judged", "folds")
HAND_IN_HELP = (
    "judged: folds whose OOF predictions lose to the training prior (paired bootstrap) leave the fallback "
    "submission in place (HAND-IN line); folds: hand in the folds whatever they score. Default: $KAGTPL_HAND_IN, "
    "else judged"
)


def parser(doc: str, data_dir: str, out_dir: str, cache: str = "") -> argparse.ArgumentParser:
    """train.py's parser, opening with the two folders every task has: the competition's data and
    the run's outputs (`cache`: what the task caches there, e.g. "decode cache")."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=data_dir, help="competition folder (read-only is fine)")
    outputs = ", ".join(["checkpoints, logs, OOF", *([cache] if cache else []), "submission.csv"])
    p.add_argument("--out-dir", default=out_dir, help=outputs)
    return p


def add_batch_flags(p, batch_size: int, effective: int, example: str = "", workers: bool = True, probe: str = ""):
    """--batch-size and --accum-steps (0: the rule for --gpu, printed with its reason at start; the
    rule tops the batch up to an `effective` one), --workers for a task that reads through a
    DataLoader, and --autoscale: the CUDA batch probe (`probe` says what it probes first)."""
    example = f" ({example})" if example else ""
    p.add_argument("--batch-size", type=int, default=batch_size, help=f"0 = rule{example}; halve if you OOM")
    p.add_argument("--accum-steps", type=int, default=0, help=f"0 = rule: top the batch up to an effective {effective}")
    if workers:
        p.add_argument("--workers", type=int, default=-1, help="-1 = min(12, usable CPUs - 1); none on the CPU")
    p.add_argument(
        "--autoscale",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"CUDA: time real steps{probe} at growing batches before fold 0; keep the fastest under 90%% of memory",
    )


def add_schedule_flags(p, epochs: int, patience: int, lr: float, weight_decay: float, val_loss: str = "val loss"):
    """--epochs, --patience (epochs without a better `val_loss`), --lr (AdamW's peak at an effective
    batch of 128, scaled by sqrt(batch/128): hardware.scaled_lr) and --weight-decay."""
    p.add_argument("--epochs", type=int, default=epochs, help="max epochs per fold (early stopping ends most sooner)")
    p.add_argument("--patience", type=int, default=patience, help=f"epochs without a better {val_loss} before stopping")
    p.add_argument("--lr", type=float, default=lr, help="peak AdamW LR at effective batch 128; x sqrt(batch/128)")
    p.add_argument("--weight-decay", type=float, default=weight_decay)


def add_run_flags(p, gpu_profile: str, budget: str) -> None:
    """The flags every task's train.py shares: the seed, hardware, precision, the time budget, dry
    runs. argparse's own errors become one ERROR line too (errors.one_line_errors)."""
    one_line_errors(p)
    p.add_argument("--seed", type=int, default=42, help="the folds and the initialisation; another checks the CV")
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
    p.add_argument(
        "--compile",
        nargs="?",
        const="on",
        default="auto",
        choices=["auto", "on", "off"],
        help=COMPILE_HELP,
    )
    p.add_argument("--cudnn-benchmark", action="store_true", help=CUDNN_HELP)
    # time budget: folds and epochs are cut to fit, prediction keeps a reserve (docs/time-budget.md)
    p.add_argument("--budget", default=budget, action=Given, help=BUDGET_HELP)
    p.set_defaults(budget_given=False)
    p.add_argument("--start-time", type=float, default=time_planner.PROCESS_START, help="budget start (run.py sets it)")
    p.add_argument("--predict-beside", action="store_true", help="run.py's: predict.py's imports not in the reserve")
    p.add_argument("--dry-run", action="store_true", help="3 batches, 1 epoch, 2 folds: checks the whole path")
    p.add_argument("--no-grow", action="store_true", default=os.environ.get("KAGTPL_GROW") == "off", help=NO_GROW_HELP)
    p.add_argument("--hand-in", default=os.environ.get("KAGTPL_HAND_IN", "judged"), choices=HAND_IN, help=HAND_IN_HELP)
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
        "--params",
        default="",
        help="tune.py's output/best_params.json: its values; flags you give still win; auto: that file if tune.py "
        "searched this run signature (run.py's default)",
    )
    p.add_argument("--train-folds", type=int, default=0, help="train only the first N folds of the split (0 = all)")
    p.add_argument(
        "--predict-reserve",
        type=float,
        default=-1,
        help="seconds of the budget kept for predict.py; -1 = the rule (15%% or the measured need); tune's trials: 0",
    )


def parse_args(p, argv=None):
    """argparse, then --params: the file's values become the parser's defaults and the command
    line is read again, so a flag you give still wins over the file. --params auto (run.py's) is
    <out-dir>/best_params.json when tune.py searched this run signature (params_file)."""
    args = p.parse_args(argv)
    if args.params:  # read from the run's own --out-dir (auto), before a dry run's folder is chosen
        path = params_file(args)
        if path is not None:
            try:
                p.set_defaults(**read_params(path, p))
            except RunError as e:  # a file you named stops the run; one found by auto never does
                if args.params != "auto":
                    raise
                why = str(e).removeprefix(f"--params {path}: ")
                print(f"PARAMS: {path} left out: {why}; this run trains with its flags")
                path = None
            else:
                args = p.parse_args(argv)
        args.params = "" if path is None else str(path)
    if getattr(args, "dry_run", False) and args.out_dir == p.get_default("out_dir"):
        # a folder of its own: README's order (dry run, train, dry run again) overwrote a trained run's folds
        args.out_dir = hardware.dry_run_dir(args.out_dir)
    args.folder_flags = given_flags(args, p, ("data_dir", "out_dir"))  # predict.py's: the DRY RUN and DONE lines
    args.signature_flags = given_flags(args, p, ("data_dir", *artifacts.SIGNATURE_FLAGS))  # tune.py's DONE line
    return args


def given_flags(args, p, names) -> list[str]:
    """The flags among `names` this run was given where they are not the defaults (the same in
    predict.py, run.py and tune.py), as a command line repeats them: ["--data-dir", "/tmp/d", ...]."""
    flags = []
    for name in names:
        if hasattr(args, name) and str(getattr(args, name)) != str(p.get_default(name)):
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return flags


def predict_command(args) -> str:
    """The predict.py command that reads this run, to run as written from where train.py was started
    (its path when that was another folder), the run's own folders named: the DRY RUN and DONE lines'."""
    return hardware.command("predict.py", *args.folder_flags)


def train_command(args) -> str:
    """The train.py command that writes the folder a predict.py or serve.py reads (their --data-dir
    and --out-dir as given: the defaults are train.py's): the lines that ask for a train.py run."""
    return hardware.command("train.py", *args.folder_flags)


def params_file(args) -> Path | None:
    """The best_params.json to use. `auto`: <out-dir>/best_params.json when it is there and was
    searched with this run signature (its params_signature: the data files' times left out, so
    the search's copy on Kaggle matches); one of another signature (other data, target, features or
    folds), or of none (an older kagtpl), is left out with a PARAMS: line. A path you name is
    used, with a WARNING when it was searched with another signature."""
    auto = args.params == "auto"
    path = Path(args.out_dir) / "best_params.json" if auto else Path(args.params)
    if auto and not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        found, without_times = record.get("signature"), record.get("params_signature")
    except (OSError, ValueError, AttributeError):
        return path  # read_params names what is wrong with it
    if without_times is not None:  # tune.py since 2026-12-03: a copy of the data with other file times matches
        found, mine = without_times, artifacts.params_signature(args)
    else:
        mine = artifacts.run_signature(args)
    if found == mine or (found is None and not auto):
        return path
    made = artifacts.made_with(found)
    if auto:
        print(f"PARAMS: {path} left out: searched with {made}, this run is {mine} (other data, target or folds)")
        print(f"PARAMS: --params {path} uses it anyway")
        return None
    print(f"WARNING: --params {path}: searched with {made}, this run is {mine}; used because you named it")
    return path


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


COMPILE_COST_S = 90.0  # torch.compile's first epoch over an eager one: resnet50 224 px on an H100, 83 s (issue 46)
COMPILE_AMORTISE = 20  # auto compiles where each fold trains at least 20x that cost: 30 min a fold


def compile_choice(args, device: torch.device) -> tuple[str, str]:
    """--compile auto -> try or off, with the reason: try (compiling.py times compiled steps against
    eager ones before the first epoch, and keeps the faster) on CUDA (compute capability >= 7,
    Triton) where the budget gives each fold COMPILE_AMORTISE x COMPILE_COST_S of training; off for dry
    runs, tune.py's one-fold trials, no budget (nothing to amortise over: --compile on), CPUs."""
    if args.compile != "auto":
        return args.compile, "--compile " + args.compile
    ok, why = can_compile(device)
    budget = time_planner.parse_duration(args.budget)
    folds = min(args.folds, args.train_folds or args.folds)
    per_fold = (budget or 0) * (1 - PredictionReserve.FRACTION) / max(folds, 1)
    cost = f"{COMPILE_COST_S:.0f}"
    if device.type != "cuda":
        return "off", f"auto: {device.type}: compiling costs ~40 s there and gains little"
    if not ok:
        return "off", f"auto: {why}"
    if args.dry_run or args.train_folds:
        return "off", "auto: a dry run or a tune.py trial is too short to pay for compiling"
    if per_fold < COMPILE_AMORTISE * COMPILE_COST_S:
        have = f"{time_planner.fmt_s(per_fold)} of training a fold" if budget else "no --budget to amortise it over"
        return "off", f"auto: {have}, under {COMPILE_AMORTISE}x its ~{cost} s cost; --compile on forces it"
    return "try", (
        f"auto: ~{time_planner.fmt_s(per_fold)} of training a fold pays {COMPILE_AMORTISE}x+ for ~{cost} s; "
        "kept only if its steps time faster than eager ones before the first epoch"
    )


def speed_settings(args, device: torch.device) -> None:
    """cuDNN's autotune (--cudnn-benchmark, off: on an H100 efficientnet_b3's first epoch took 87 s
    with it and 26 s without, steady epochs alike, and every process pays it again) and
    --compile resolved (compile_choice), said in one COMPILE line."""
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    args.compile, why = compile_choice(args, device)
    print(f"COMPILE: {args.compile} ({why})")


def begin(args, ranges: dict | None = None) -> torch.device:
    """A run's first step: the flags checked (FLAG_RANGES plus the task's `ranges`), --dry-run's
    small plan, the output folder (locked against a second train.py, stale temp files of killed
    runs swept), the seed, the device. A SIGTERM from here on is kept for the planner
    (time_planner.keep_early_stops): the run writes its fallback, then stops."""
    time_planner.keep_early_stops()
    check_flags(args, {**FLAG_RANGES, **(ranges or {})})
    locks.check_apart(args.data_dir, args.out_dir)  # a run folder inside the data would change the data
    args.signature = artifacts.run_signature(args)  # carried by every artifact of this run
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
        locks.lock_output(out)
        room.sweep_stale_tmp(out)
        logs.log_to(out / "train.log")  # a fold worker's lines reach it through this process's relay
    print(f"PARALLEL: {args.parallel} ({why})")
    speed_settings(args, device)  # on the device this process trains on (a DDP rank's own card)
    if args.dry_run and not worker:
        where = "its own folder (a trained run's files are never touched)" if out.name == "dry-run" else "--out-dir"
        print(f"DRY RUN: everything goes to {out}, {where}; {predict_command(args)} predicts with it")
    seed_everything(args.seed)
    return device
