"""The files a run leaves beside its checkpoints and the run signature every one of them carries:
the folds file, the OOF files (per fold, oof.csv, oof_<model>.csv), the resolved config and the
fallback submission.

The run signature names what makes artifacts combinable: the data folder's files, the target
and the folds (docs/generated-project.md). A checkpoint, an OOF file or tune.py's
best_params.json of another signature is left out with a line saying why. It is machinery:
`copier update` may replace it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from . import growth, hand_in, hardware, logs, parallel, readback, serving, storage, submission
from .errors import DataError

# The flags that decide what a run's artifacts mean: which rows, which target, which features,
# which folds. Training settings (model, LR, epochs) are not among them: the blend mixes models.
SIGNATURE_FLAGS = (
    "labels_csv", "label_col", "train_dir", "image_ext", "train_csv", "id_col", "target", "drop", "dates", "problem",
    "text_cols", "text_sep", "folds", "seed", "mask_dir", "mask_ext", "rle_col", "class_col", "mask_values",
    "missing_mask", "rle_order", "rle_start", "work_size", "box_cols", "box_format", "box_scale", "box_classes",
    "missing_boxes",
)  # fmt: skip
SIGNATURE_COLUMN = "signature"  # the OOF files' column that carries it
# The training flags the machinery adds (runflags.add_schedule_flags, images.add_weights_flags): a
# complete fold is skipped on a rerun only when trained with the same ones, as with its task's
# resume_keys. Unlisted, a rerun with another --lr skipped all 5 folds as complete, and the
# experiments table gave the new LR the old folds' CV.
TRAINING_FLAGS = ("epochs", "patience", "lr", "weight_decay", "pretrained")


TABLE_SUFFIXES = (".csv", ".tsv", ".json", ".parquet")  # read whole into the fingerprint: relabelled rows count
# Python's bytecode caches: serve.py imports the competition's kaggle_evaluation package from the data
# folder, which writes kaggle_evaluation/__pycache__/ there. Counted, a dry run of serve.py changed the
# signature, and the next train.py retrained every complete fold as "other data" (2026-12-03).
NOT_DATA = ("__pycache__",)


def not_data(name: str, path, around: bool) -> bool:
    """A folder entry the fingerprint leaves out: bytecode (NOT_DATA), and, `around` (the data folder
    holds the project: `kagtpl new` run in it), the folder that holds the project, its runs' too."""
    return name in NOT_DATA or (around and os.path.isdir(path) and hardware.holds_project(path))


def data_fingerprint(folder, times: bool = True) -> list:
    """The data folder: a content hash per top-level table (train.csv, labels.csv,
    sample_submission.csv: a relabelled row or a class column added to the sample changes it,
    even at the same size), size per other file, and per folder a hash of every file in it
    (nested too) by name, size and modification time: an emptied mask, a re-recorded clip or an
    edited image changes it, as it changes the image cache's key, with no image read. A copy
    elsewhere that keeps the times (cp -p, rsync -t) signs alike; `times=False` leaves the times
    out (params_signature: a copy that did not keep them signs alike too). Bytecode (NOT_DATA) is
    left out, and so is the project when the data folder holds it (not_data)."""
    found = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return found
    around = hardware.holds_project(folder)  # else no folder in it can hold the project: not asked again
    for entry in entries:
        if not_data(entry.name, entry.path, around):
            continue
        if entry.is_dir():
            found.append((entry.name, folder_digest(entry.path, times, around)))
        elif entry.is_file() and entry.name.lower().endswith(TABLE_SUFFIXES):
            with open(entry.path, "rb") as f:
                found.append((entry.name, hashlib.file_digest(f, "sha1").hexdigest()))
        elif entry.is_file():
            found.append((entry.name, entry.stat().st_size))
    return found


def folder_digest(path: str, times: bool = True, around: bool = False) -> str:
    """Every file under `path` as (relative name, size, whole seconds of its modification time, or
    not with `times=False`), in name order, hashed: stat calls only (~0.1 s for 10,000 files).
    `around`: the data folder holds the project, whose folder is left out here too."""
    rows = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not not_data(d, os.path.join(root, d), around))
        for name in sorted(files):
            st = os.stat(os.path.join(root, name))
            when = f"\t{int(st.st_mtime)}" if times else ""
            rows.append(f"{os.path.relpath(os.path.join(root, name), path)}\t{st.st_size}{when}")
    return hashlib.sha1("\n".join(rows).encode()).hexdigest()


def run_signature(args, times: bool = True) -> str:
    """The run signature: 12 hex digits of the data folder's fingerprint and the SIGNATURE_FLAGS
    this script has. Every artifact carries it (checkpoints, OOF files, config.json,
    best_params.json); one of another signature was made from other data, target, features or folds."""
    flags = {name: getattr(args, name) for name in SIGNATURE_FLAGS if hasattr(args, name)}
    data = data_fingerprint(getattr(args, "data_dir", ""), times)
    text = json.dumps([data, flags], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def params_signature(args) -> str:
    """The run signature without the data files' modification times: what best_params.json is
    checked against. Hyper-parameters searched on these files hold for a copy of them that did not
    keep the times (an upload to Kaggle, read in /kaggle/input), where the folds' artifacts, whose
    resume must see an edited image, keep the stricter run signature."""
    return run_signature(args, times=False)


def run_keys(comp) -> tuple:
    """The config keys a finished fold's checkpoint must share to be skipped or ensembled: the
    machinery's training flags the run has (TRAINING_FLAGS), the competition's own (model settings)
    and the run signature (data, target, features, folds)."""
    args = getattr(comp, "args", None)
    return (*(f for f in TRAINING_FLAGS if hasattr(args, f)), *comp.resume_keys, "signature")


def checkpoint_config(args, machine, batching) -> dict:
    """The resolved config saved in every checkpoint: the flags, with the batch, accumulation and
    LR actually used (after the probe) and the precision; predict.py rebuilds the model from it.
    `given`: those flags as given, which resume compares (storage.REPLACED_FLAGS)."""
    used = {"batch_size": batching.size, "accum_steps": batching.accum_steps, "lr": batching.lr}
    given = {k: getattr(args, k) for k in storage.REPLACED_FLAGS if hasattr(args, k)}
    return {**vars(args), **used, "given": given, "amp": machine.amp.mode, "channels_last": machine.channels_last}


def signed(frame: pd.DataFrame, signature: str) -> pd.DataFrame:
    """An OOF frame with the run signature as its last column."""
    frame[SIGNATURE_COLUMN] = signature
    return frame


def made_with(found: str | None) -> str:
    """How a left-out artifact's signature is named in its line."""
    return f"run signature {found}" if found else "no run signature (an older kagtpl)"


def signature_of(frame: pd.DataFrame) -> str | None:
    """The run signature an OOF file carries; None for one written before signatures (0.5.0)."""
    if SIGNATURE_COLUMN not in frame.columns or frame.empty:
        return None
    return str(frame[SIGNATURE_COLUMN].iloc[0])


def fixed_folds(out: Path, ids, y, k: int, seed: int, stratify: bool) -> tuple[list, str]:
    """The project's folds, made once and reused by every model and every later run, so their OOF
    scores compare and their OOF sets blend: output/folds-k{k}-seed{seed}.csv (id, fold). Another
    --folds or --seed is another file, never an overwrite; a file whose ids are not train.csv's
    is a DataError. Returns the (train, validation) index pairs and the file's name."""
    from sklearn.model_selection import KFold, StratifiedKFold

    path = Path(out) / f"folds-k{k}-seed{seed}.csv"
    ids = np.asarray(ids).astype(str)
    # one that does not read back is made anew: the same folds (the same splitter, seed and rows)
    saved = readback.read_if_whole(path, "FOLDS: {name} does not read back ({why}): made again from the same seed")
    if saved is not None:
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
        storage.write_csv_atomic(readback.read_ours(Path(out) / source), Path(out) / name)


def write_oof(comp, fold, y: np.ndarray, pred: np.ndarray, path: Path, args) -> None:
    """The fold's validation predictions beside their ids, targets and the run signature (oof_fold{k}.csv)."""
    oof = pd.DataFrame({comp.id_col: fold.ids_valid[: len(pred)], "fold": fold.index, **target_columns(y)})
    preds = pd.DataFrame(np.asarray(pred).reshape(len(pred), -1), columns=comp.oof_columns)
    oof = pd.concat([oof, preds], axis=1)  # one join: detection's 600 columns one by one fragment the frame
    storage.write_csv_atomic(signed(oof, args.signature), path)


def signed_oof(out: Path, signature: str) -> pd.DataFrame | None:
    """Every fold's OOF rows in `out` of this run signature, as one frame (None when there is none):
    what a task's postprocess.json is chosen on. A fold's rows are its seeds ensembled where a kept
    growth wrote them (oof_fold{k}_seeds.csv, seeds_oof.py: masks' statistics cannot be averaged),
    else its first seed's oof_fold{k}.csv."""
    out, frames = Path(out), []
    for k in sorted(int(m[1]) for p in out.glob("oof_fold*.csv") if (m := re.fullmatch(r"oof_fold(\d+)\.csv", p.name))):
        seeds = out / growth.seeds_oof_name(k)
        frame = read_signed(seeds, signature) if seeds.is_file() else None  # cut short: the first seed's
        frames.append(frame if frame is not None else read_signed(out / growth.oof_name(k), signature))
    frames = [f for f in frames if f is not None]
    return pd.concat(frames, ignore_index=True) if frames else None


def read_signed(path: Path, signature: str) -> pd.DataFrame | None:
    """An OOF file of this run signature; one of another (or none: written before 0.6.0) is left
    out with an OOF: line saying why, as is one that does not read back (readback.check_whole): its
    fold's model still counts, scored without its rows. None when it is missing or left out."""
    said = "OOF: {name} left out: it does not read back ({why}); its fold's model is still ensembled"
    frame = readback.read_if_whole(path, said)
    if frame is None:
        return None
    found = signature_of(frame)
    if found != signature:
        print(
            f"OOF: {path.name} left out: made with {made_with(found)}, this run is {signature} (other data, target or folds)"
        )
        return None
    return frame


def seeds_averaged(
    comp, out: Path, k: int, signature: str, counted: set | None = None
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """Fold k's OOF frame (the first seed's), and the same rows with their predictions averaged over
    every grown seed's whole fold (growth.py), as predict.py averages the checkpoints; None when no
    seed was grown. Where the competition's OOF cannot be averaged (`oof_averages = False`: boxes,
    masks), the fold's rows ensembled by a validation pass (seeds_oof.py), None without them.
    `counted` (grown_seeds): the (fold, seed) pairs whose OOF file counts; None: every file there."""
    first = read_signed(out / growth.oof_name(k), signature)
    if not getattr(comp, "oof_averages", True):
        path, grown = out / growth.seeds_oof_name(k), counted is None or any(f == k for f, _ in counted)
        ensembled = read_signed(path, signature) if grown and first is not None and path.is_file() else None
        return first, ensembled if ensembled is not None and same_rows(comp, first, ensembled) else None
    seeds = range(2, growth.MAX_SEEDS + 1)
    paths = [out / growth.oof_name(k, s) for s in seeds if (k, s) in counted or counted is None]
    grown = [read_signed(p, signature) for p in paths if p.exists()]
    return first, None if first is None else average_seeds(comp, first, [f for f in grown if f is not None])


def grown_seeds(comp, out: Path, folds: list[int], config: dict) -> set[tuple[int, int]]:
    """The (fold, seed) pairs of grown seeds that count in the OOF: the OOF file is there and its
    checkpoint is whole and made with this run's resume keys (the signature alone let a 32-px run's
    seeds into a 24-px run's CV); an OOF line says why each other one is left out."""
    counted = set()
    for k, seed_no in ((k, s) for k in folds for s in range(2, growth.MAX_SEEDS + 1)):
        oof, path = Path(out) / growth.oof_name(k, seed_no), Path(out) / growth.checkpoint_name(k, seed_no)
        if not oof.is_file():
            continue
        ckpt = storage.load_checkpoint(path) if path.is_file() else None
        differ = [] if ckpt is None else storage.differing_keys(ckpt, config, run_keys(comp))
        if ckpt is None or not ckpt.get("complete"):
            print(f"OOF: {oof.name} left out: its checkpoint {path.name} is not whole")
        elif differ:
            said = storage.settings_said(ckpt, config, differ)
            print(f"OOF: {oof.name} left out: {path.name} was made with other settings ({said})")
        else:
            counted.add((k, seed_no))
    return counted


def average_seeds(comp, first: pd.DataFrame, grown: list[pd.DataFrame]) -> pd.DataFrame | None:
    """`first`'s rows with their predictions averaged over the `grown` seeds' frames of the same
    rows (a table's boosters' too: boosters.seeds_oof); None when none holds them."""
    grown = [f for f in grown if same_rows(comp, first, f)]
    if not grown:
        return None
    averaged = first.copy()
    cols = comp.oof_columns
    averaged[cols] = np.mean([f[cols].to_numpy(float) for f in (first, *grown)], axis=0)
    return averaged


def same_rows(comp, a: pd.DataFrame, b: pd.DataFrame) -> bool:
    return np.array_equal(a[comp.id_col].astype(str).to_numpy(), b[comp.id_col].astype(str).to_numpy())


def oof_scores(comp, out: Path, folds: list[int], signature: str, counted: set | None = None, judge=False) -> tuple:
    """oof.csv from the folds' OOF files of this run signature (the `counted` grown seeds averaged
    in: kept_seeds), the OOF line, the metric per fold, and the rows the scores are over. `judge`
    (--hand-in judged, not a dry run): folds that lose to the training prior leave the fallback."""
    pairs = [seeds_averaged(comp, out, k, signature, counted) for k in folds]
    oofs = [averaged if averaged is not None else first for first, averaged in pairs if first is not None]
    if not oofs:
        return {}, [], 0
    oof = pd.concat(oofs, ignore_index=True)
    storage.write_csv_atomic(oof, out / "oof.csv")
    y, pred = read_targets(oof), oof[comp.oof_columns].to_numpy()
    scores = comp.score(y, pred)
    named = comp.name if getattr(comp, "oof_names_model", False) else None  # a table's MLP beside its boosters
    print(logs.oof_line(scores, len(oof), sorted(set(oof["fold"])), named))
    hand_in.judge(comp, out, y, pred, scores if judge else {})  # folds that lose to the prior: the fallback stays
    per_fold = [list(comp.score(read_targets(f), f[comp.oof_columns].to_numpy()).values())[-1] for f in oofs]
    return scores, per_fold, len(oof)


def kept_seeds(comp, out: Path, folds: list[int], signature: str, counted: set) -> set:
    """The grown seeds (`counted`: grown_seeds) kept after the GROW: OOF line's test: all of
    them, or none when averaged in they lose to the first seeds on the same rows."""
    pairs = [seeds_averaged(comp, out, k, signature, counted) for k in folds]
    files = [out / growth.checkpoint_name(k, s) for k, s in sorted(counted)]
    if grown_gain_line(comp, pairs, out, files):
        return counted
    for k in folds:  # the folds' rows are the first seeds' again (postprocess.json is chosen on them)
        (out / growth.seeds_oof_name(k)).unlink(missing_ok=True)
    return set()


def grown_gain_line(comp, pairs: list, out: Path, files: list[Path], model: str | None = None) -> bool:
    """GROW's proof, on the same OOF rows: the metric of the first seed alone against the grown
    seeds averaged in (the folds that have grown seeds only), and the verdict: kept, or left out
    (hand_in.json's "seeds" section: predict.py leaves `files` out) when they lose in the paired
    bootstrap. `model` names a table's booster. Whether they are kept."""
    section = f"seeds_{model}" if model else "seeds"
    both = [(first, averaged) for first, averaged in pairs if first is not None and averaged is not None]
    if not both:
        hand_in.record(out, section, None)
        return True
    first, averaged = (pd.concat(frames, ignore_index=True) for frames in zip(*both, strict=True))
    y, cols = read_targets(first), comp.oof_columns
    name, one = list(comp.score(y, first[cols].to_numpy()).items())[-1]
    grown = list(comp.score(y, averaged[cols].to_numpy()).values())[-1]
    share, n = hand_in.seeds_lose(comp, y, first[cols].to_numpy(), averaged[cols].to_numpy())
    keep = share < hand_in.CONFIDENCE
    hand_in.record(out, section, None if keep else hand_in.mtimes(files))
    folds = sorted(set(first["fold"]))
    named = f" ({model})" if model else ""
    gain = f"{one:.4f} with one seed -> {grown:.4f} with the grown seeds averaged in"
    test = f"worse in {share:.0%} of {n} paired bootstrap resamples"
    verdict = f"kept ({test})" if keep else f"left out: {test}; predict.py leaves out their {len(files)} file(s)"
    print(f"GROW: OOF {name} {gain} (folds {folds}){named}: {verdict}")
    return keep


def target_columns(y: np.ndarray) -> dict:
    """The OOF file's target: one `target` column, or target_0.. for several (multi-label, several scores)."""
    if y.ndim == 1:
        return {"target": y}
    return {f"target_{j}": y[:, j] for j in range(y.shape[1])}


def read_targets(oof: pd.DataFrame) -> np.ndarray:
    if "target" in oof.columns:
        return oof["target"].to_numpy()
    return oof[[c for c in oof.columns if c.startswith("target_")]].to_numpy()


PREDICTED = ("p_", "pred")  # an OOF file's prediction columns: p_<class>, a score's pred, a text's pred_<target>


def oof_rows(out: Path, signature: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(targets, predictions) of this run's oof.csv (the folds' own rows, grown seeds averaged in as the
    ensemble averages them); (None, None) when it is missing, cut short or another run's (read_signed's line)."""
    oof = read_signed(Path(out) / "oof.csv", signature)
    if oof is None:
        return None, None
    return read_targets(oof), oof[[c for c in oof.columns if c.startswith(PREDICTED)]].to_numpy()


def fallback_submission(args, sample, y: np.ndarray, classes: list, config: dict | None = None) -> None:
    """A valid <out-dir>/submission.csv as soon as preflight has read sample_submission: the
    training prior for every row (submission.write_fallback). A run stopped anywhere after this
    still hands one in; predict.py replaces it. `config`: problem and submission (probs | label)
    when the flags do not hold them (the image task's). Its values are also serve.py's answer
    before a good one (serving.write_defaults)."""
    if parallel.writes() and not parallel.fold_worker():
        out = Path(args.out_dir)
        path, since = out / "submission.csv", args.start_time  # one written since is this run's (started again)
        made = submission.write_fallback(path, sample, y, config or vars(args), classes, since)
        if made is not None:  # its kind: class labels (numbers too) carry their most common value in serve.py
            serving.write_defaults(out, *made, args.signature)
