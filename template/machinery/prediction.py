"""predict.py's core, one for every task: the flags every predict.py shares, the steps before its
first fold (the flags checked, run.py's wait for train.py, the device, the ensemble's checkpoints
and their config), the machine the folds run on, the fold loop (each fold restored, predicted,
freed; the deadline's stop) and serve.py's ensemble, loaded once. Each task's predict.py keeps what
is its own: its test data, its model's prediction of one fold, its TTA, its decoding and what it
writes.

Before, the six predict.py files each held these lines word for word (issue 58: 37% of predict.py's
lines stood in another task's); a change to how predict.py starts (`--after-train`) was made six
times. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from . import gpu, hand_in, hardware, room, serving, storage, submission
from .errors import NothingTrained, one_line_errors
from .machine import Machine, inference_machine, profile
from .runflags import check_flags, given_flags, train_command

RANGES = {"deadline": (0, 1e11), "batch_size": (0, 65_536), "workers": (-1, 64)}  # those a predict.py has


def parser(doc: str, data_dir: str, out_dir: str, test_data: str, models: str = "model_fold*.pth"):
    """predict.py's parser with the flags every task's has; `test_data` says what --data-dir holds."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=data_dir, help=f"competition folder with the test {test_data}")
    p.add_argument("--out-dir", default=out_dir, help=f"where train.py wrote {models}; submission goes here")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--submission", default="submission.csv", help="file name inside --out-dir")
    p.add_argument("--deadline", type=float, default=0, help="unix time to finish by (run.py sets it); 0 = none")
    p.add_argument("--after-train", action="store_true", help="run.py's: import now, predict when train.py ends")
    return p


def loader_flags(p: argparse.ArgumentParser, batch_help: str, workers_help: str = "") -> None:
    """--batch-size and --workers, for the tasks that read their test set through a DataLoader."""
    p.add_argument("--batch-size", type=int, default=0, help=batch_help)
    p.add_argument(
        "--workers", type=int, default=-1, help="-1 = min(12, usable CPUs - 1); none on the CPU" + workers_help
    )


def tta_flag(p: argparse.ArgumentParser, what: str = "average with a horizontal flip") -> None:
    """--tta / --no-tta: the mirrored image's view, only where training used --hflip."""
    p.add_argument(
        "--tta", action=argparse.BooleanOptionalAction, default=True, help=f"{what} (only if training used --hflip)"
    )


def parse(p: argparse.ArgumentParser, argv=None, ranges: dict | None = None) -> argparse.Namespace:
    """The flags parsed (argparse's errors as one ERROR line) and checked against their ranges;
    `folder_flags`, the --data-dir and --out-dir given, for the lines that ask for a train.py run."""
    one_line_errors(p)
    args = p.parse_args(argv)
    check_flags(args, {k: v for k, v in {**RANGES, **(ranges or {})}.items() if hasattr(args, k)})
    args.folder_flags = given_flags(args, p, ("data_dir", "out_dir"))
    return args


@dataclass
class Start:
    """Where predict.py stands before its first fold."""

    supervised: bool  # run.py started it beside train.py: a hard stop at the deadline (submission.FoldClock)
    device: torch.device
    out: Path
    data: Path
    checkpoints: list  # (path, checkpoint) of the ensemble: one run's folds, best first
    config: dict  # the first checkpoint's resolved config (one run: the same for all)
    classes: list
    train: str  # the train.py command that writes these folders (runflags.train_command): the lines that ask for one


def start(args, required: bool = True, preload: tuple[str, ...] = ()) -> Start:
    """run.py's wait for train.py (the model's libraries, `preload`, imported while it trains:
    submission.import_beside), the device (a card this torch cannot run: one ERROR line before any
    reading), the ensemble's checkpoints (storage.ensemble_checkpoints: the fallback's verdict,
    the folds left out) and stale temp files of killed runs swept. `required=False` (the table,
    whose trees need no checkpoint): with none, the config train.py wrote beside its models. No
    model at all under run.py: this run's fallback stays (hand_in.untrained)."""
    supervised = submission.wait_for_train(args.after_train, Path(args.out_dir), preload)
    device = gpu.resolve_device(args.device)
    out, data, train = Path(args.out_dir), Path(args.data_dir), train_command(args)
    try:
        checkpoints = storage.ensemble_checkpoints(out, required=required)
        room.sweep_stale_tmp(out)
        if checkpoints:
            config, classes = checkpoints[0][1]["config"], checkpoints[0][1]["classes"]
        else:
            config, classes = storage.read_config(out, train)
    except NothingTrained as e:  # under run.py, this run's fallback stays (hand_in.untrained)
        raise hand_in.untrained(NothingTrained(e.what, e.out_dir, train), args.after_train, args.submission) from None
    return Start(supervised, device, out, data, checkpoints, config, classes, train)


def hand_in_first(args, run: Start, rows, kind: str = "") -> None:
    """Under a deadline (run.py's, or `kagtpl kaggle --predict`'s notebook), before any fold: a
    submission of these rows (submission.hand_in_first). In a notebook on Kaggle's hidden rows no
    train.py fallback is there, and a predict.py stopped before its first fold handed in nothing."""
    if args.deadline and (kind or (run.out / serving.DEFAULTS_FILE).is_file()):
        defaults = {} if kind else serving.read_defaults(run.out, run.train)
        submission.hand_in_first(run.out / args.submission, rows, defaults, kind)


def loader(args, device: torch.device) -> dict:
    """The test set's DataLoader settings: --workers, or min(12, usable CPUs - 1); none on the CPU."""
    return hardware.flag_loader(args.workers, device.type)


def machine(args, run: Start) -> tuple[dict, hardware.Profile, Machine]:
    """The test set's loader settings, the profile of the card predict runs on (not the one training
    ran on: its batch rules) and the machine: the ensemble is one run's folds
    (storage.ensemble_checkpoints), one precision and memory layout for all."""
    settings = loader(args, run.device)
    found = profile("auto", run.device)  # printed before PRECISION: a WARNING when the card is not listed
    runs_on = inference_machine(run.device, run.checkpoints, settings, run.config.get("channels_last", False))
    return settings, found, runs_on


def restore_fold(build_model, device, channels_last: bool, path: Path, ckpt: dict):
    """One fold's model, build_model(config, number of classes) with the checkpoint's weights, in its
    inputs' memory layout; None when the weights do not fit it (storage.restore's WARNING)."""
    build = partial(build_model, ckpt["config"], len(ckpt["classes"]))
    model = storage.restore(path, build, ckpt["model"], device)
    if model is not None and channels_last:  # the model's layout follows its inputs'
        model = model.to(memory_format=torch.channels_last)
    return model


def each_fold(checkpoints: list, clock: submission.FoldClock, restore, predict_fold) -> list:
    """The fold loop: each checkpoint the clock lets in (best first), restore(path, ckpt) -> its
    model (None: weights that do not fit, skipped like an unreadable file), predict_fold(path, ckpt,
    model) -> the fold's predictions, or None when the deadline stopped it (the loop ends there).
    Each model leaves the card before the next fold's weights are loaded: the callback holds the
    only reference. Returns the folds' predictions, in the order they were done."""
    done = []
    for path, ckpt in clock.folds(checkpoints):
        model = restore(path, ckpt)
        if model is None:
            continue
        predicted = predict_fold(path, ckpt, model)
        del model
        gpu.free_gpu_memory()
        if predicted is None:
            break
        done.append(predicted)
    return done


class Folds:
    """predict.py's folds under its deadline, for a test set of `rows` rows in `views` views each:
    the deadline's clock (submission.FoldClock: run.py's hard stop when it started predict.py), the
    check each test batch makes (`on_batch`, from the measured rate), the fold loop (each_fold) and,
    when not one fold fit before the deadline, the submission already there kept (`keep`).
    `hard_stop=False`: the table's MLP, whose trees still run after it."""

    def __init__(self, args, run: Start, rows: int, views: int = 1, hard_stop: bool = True):
        self.clock = submission.FoldClock(args.deadline, views=views, hard_stop=hard_stop and run.supervised)
        self.on_batch = partial(self.clock.batch_done, total=rows)
        self.run, self.path = run, run.out / args.submission

    def predict(self, predict_fold, build_model=None, channels_last: bool = False, restore=None) -> list | None:
        """Each fold's predict_fold(path, ckpt, model), in the order done; each model restored by
        `restore(path, ckpt)`, by default restore_fold with the task's build_model. None when the
        deadline came before one fold was done: then `keep`."""
        restore = restore or partial(restore_fold, build_model, self.run.device, channels_last)
        done = each_fold(self.run.checkpoints, self.clock, restore, predict_fold)
        return None if not done and self.clock.cut else done

    def keep(self, rows, kind: str = "") -> None:
        """No fold before the deadline: the submission already there stays (submission.keep)."""
        submission.keep(self.path, rows, kind)


def serve_folds(
    out: Path, device, build_model, clock: serving.StartClock, layout: bool = True, check=None
) -> tuple[dict, list, Machine, list]:
    """serve.py's ensemble, loaded once: (config, classes, machine, [(path, checkpoint, model)]).
    A gateway batch is a few rows, read in this process (no loader workers); each fold is rebuilt
    by restore_fold(build_model, ...), loaded by serving.load_folds against the clock.
    `layout`: the models take their inputs' memory layout (image, audio); False keeps them as built.
    `check(config)`: the task's refusal of a run it cannot serve, before any fold loads."""
    checkpoints = storage.ensemble_checkpoints(out)
    config, classes = checkpoints[0][1]["config"], checkpoints[0][1]["classes"]
    if check is not None:
        check(config)
    settings = hardware.loader_settings(1, device.type == "cuda")
    runs_on = inference_machine(device, checkpoints, settings, config.get("channels_last", False))
    restore = partial(restore_fold, build_model, device, layout and runs_on.channels_last)
    folds = serving.load_folds(checkpoints, restore, clock)
    print(f"SERVE: ensemble: {len(folds)} fold(s) {[c.get('fold') for _, c, _ in folds]}")
    return config, classes, runs_on, folds
