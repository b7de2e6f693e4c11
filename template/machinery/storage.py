"""Files that must survive a kill: checkpoints and CSVs, written to a temporary file and renamed.

A checkpoint holds the state_dict, the resolved config and the class list: predict.py rebuilds
the model from it alone. Loading uses torch.load(weights_only=True), so a tampered file can
not run code. torch is imported only where a checkpoint is read or written, so the CSV writers
(submission.py, experiments.py) stay torch-free. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

from .errors import TRAIN, Damaged, DataError, DiskFull, KeptFallback, NothingTrained

# A temporary file's name carries its writer's pid (".model_fold0.pth.4242.k3j_x9a1.tmp"), so a
# later run can tell a killed run's leftovers from a live writer's file.
TMP_PID = re.compile(r"\.(\d+)\.(?:[a-z0-9_]+\.)?tmp$")


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a write the disk (or the quota) has no room for
UMASK = os.umask(0o022)  # read once (setting it is the only way to read it), then put back
os.umask(UMASK)


def tmp_name(path: Path) -> Path:
    """The temporary file `path` is written to before its rename (for writers that need a fixed name)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write(path: Path, write_fn) -> None:
    """write_fn(tmp_path) writes the file; it only replaces `path` once complete, so a
    kill at any moment leaves either the old file or the new one, never half of one.
    A full disk is a DiskFull (a RunError) saying so; the old file is kept."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    full = False
    try:
        write_fn(tmp)
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600: a teammate could not read a checkpoint or the submission
        os.replace(tmp, path)
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        full = True
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    if full:  # said once the half-written file is gone: the space there really is
        raise DiskFull(disk_full(path))


def disk_full(path: Path) -> str:
    free = shutil.disk_usage(Path(path).parent).free / 2**20
    return f"{path}: the disk is full ({free:.0f} MB free); nothing was replaced, the previous file is intact"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs: a killed one its parent has not reaped yet (a zombie,
    state Z in /proc) does not; a tune worker's check in that moment counted its trial running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS), or gone meanwhile: as kill said
        return True


def first_non_utf8_line(path: Path) -> int:
    for n, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return n
    return 1


# pandas' default missing-value words: read as text, they are labels ("NA": North America, a class
# "None", an id "null"); in a column of numbers they are its missing values (House Prices' "NA")
NA_WORDS = frozenset(
    "#N/A,#N/A N/A,#NA,-1.#IND,-1.#QNAN,-NaN,-nan,1.#IND,1.#QNAN,<NA>,N/A,NA,NULL,NaN,None,n/a,nan,null".split(",")
)
SEPARATORS = (",", ";", "\t")


def separator(path: Path) -> str:
    """The header line's separator: a comma when it has one, else a semicolon or a tab (a
    spreadsheet's "CSV" in a European locale), else a comma (a one-column file). The same rule
    as kagtpl's, so the generator and the project read a file alike."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        first = f.readline()
    return next((s for s in SEPARATORS if s in first), ",")


def read_csv(path: Path, text=(), nrows: int | None = None):
    """A competition CSV as the competition means it: UTF-8 with or without a byte-order mark,
    the header line's own separator, header names stripped (a WARNING names them), every cell
    read as text first. Only an empty cell is missing: "NA", "None", "null" are values. A column
    whose cells are all numbers (or empty, or a missing-value word like "NA") becomes numeric;
    the columns named in `text` (ids, labels; by name or position; True: all) stay text, so id
    00200 stays "00200".
    The ways a CSV goes wrong are DataErrors naming the file (and the line): missing, empty
    (0 bytes), header only, not UTF-8, a row with too many fields."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found (check --data-dir)")
    try:
        df = pd.read_csv(
            path, sep=separator(path), dtype=str, keep_default_na=False, na_values=[""], encoding="utf-8-sig",
            nrows=nrows,
        )  # fmt: skip
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file is empty (0 bytes or blank lines only)") from None
    except UnicodeDecodeError:
        raise DataError(f"{path} line {first_non_utf8_line(path)}: not UTF-8 text; re-save the file as UTF-8") from None
    except pd.errors.ParserError as e:
        found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(e))
        if found:
            want, line, saw = found.groups()
            raise DataError(f"{path} line {line}: {saw} fields, the header has {want} (a stray comma?)") from None
        raise DataError(f"{path}: cannot be parsed as CSV ({str(e).strip()[:160]})") from None
    if df.empty:
        raise DataError(f"{path}: no rows (only a header)")
    names = [str(c).strip() for c in df.columns]
    if names != [str(c) for c in df.columns]:
        spaced = [str(c) for c in df.columns if str(c) != str(c).strip()]
        print(f"WARNING: {path}: header names with spaces around them, read without: {spaced} -> {names}")
        df.columns = names
    for i, c in enumerate(df.columns):
        if text is not True and c not in text and i not in text:
            df[c] = as_numbers(df[c])
    return df


def as_numbers(column):
    """A text column whose cells are all numbers, empty or a missing-value word, as numbers (the
    words missing); any other column as it is."""
    import pandas as pd

    words = column.isin(NA_WORDS)
    values = pd.to_numeric(column.mask(words), errors="coerce")
    if values.isna().sum() != (column.isna() | words).sum() or values.notna().sum() == 0:
        return column  # a word that is not a number: a text column (or all missing: nothing to say)
    return values


def write_csv_atomic(df, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


def write_config(out_dir: Path, config: dict, classes: list) -> None:
    """output/config.json: a run's resolved config and class list, for models that leave no
    checkpoint (the trees): predict.py reads it when there is no model_fold*.pth."""
    import json

    text = json.dumps({"config": config, "classes": list(classes)}, indent=1, default=str)
    atomic_write(Path(out_dir) / "config.json", lambda tmp: Path(tmp).write_text(text))


def read_config(out_dir: Path, train: str = TRAIN) -> tuple[dict, list]:
    """The config train.py wrote beside its models (a table's trees trained alone); `train`, the
    command that writes it again (runflags.train_command)."""
    import json

    path = Path(out_dir) / "config.json"
    if not path.is_file():
        raise NothingTrained("model_fold*.pth and no config.json", out_dir, train)
    try:
        saved = json.loads(path.read_text())
        return dict(saved["config"]), list(saved["classes"])
    except (ValueError, KeyError, TypeError) as e:  # cut short, not JSON, not train.py's
        raise Damaged(path, f"{type(e).__name__}; {train} writes it again as it starts") from None


def save_checkpoint(path: Path, model, config: dict, classes: list, **meta) -> None:
    """state_dict + resolved config + class list: predict.py rebuilds the model from this alone."""
    import torch

    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):  # and DDP: the bare model's keys
        model = model.module
    state = {k: v.detach().cpu() for k, v in model_state(model).items()}
    payload = {"model": state, "config": config, "classes": list(classes), **meta}
    atomic_write(path, lambda tmp: torch_save(payload, tmp))


class _NotedWrites:
    """A file torch.save writes through, keeping the OSError a write raised (a full disk)."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def torch_save(obj, path) -> None:
    """torch.save, a full disk raised as the OSError it is (atomic_write's RunError then says so):
    torch's own writer meets ENOSPC and raises RuntimeError("[enforce fail at inline_container.cc]
    unexpected pos"), which said nothing of the disk and left a traceback where the line belongs."""
    import torch

    with open(path, "wb") as f:
        noted = _NotedWrites(f)
        try:
            torch.save(obj, noted)
        except RuntimeError:
            if noted.error is None:
                raise
            raise noted.error from None


def model_state(model) -> dict:
    """What a checkpoint holds of the model: its state_dict, or what the model says it is (a text
    model with LoRA adapters: the adapters and the head, not the frozen base model)."""
    return getattr(model, "checkpoint_state", model.state_dict)()


def load_model_state(model, state: dict) -> None:
    getattr(model, "load_checkpoint_state", model.load_state_dict)(state)


def load_fold_model(path: Path, build, machine):
    """build() with checkpoint `path`'s weights, on the machine's device in the layout the fold
    trained in and predict.py runs it (channels_last): a saved fold predicting its validation rows
    again (tta_views.py, seeds_oof.py). None when the file does not read back (load_checkpoint)."""
    import torch

    ckpt = load_checkpoint(path)
    if ckpt is None:
        return None
    model = build().to(machine.device)
    load_model_state(model, ckpt["model"])
    return model.to(memory_format=torch.channels_last) if machine.channels_last else model


def mark_complete(path: Path, **meta) -> bool:
    """Flag a fold's best checkpoint as complete (a rerun then skips the fold), with `meta` (the
    fold's timing, which a rerun's growth prices by)."""
    import torch

    if not Path(path).exists():
        return False
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    ckpt.update(meta)
    ckpt["complete"] = True
    atomic_write(path, lambda tmp: torch_save(ckpt, tmp))
    return True


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint, or None (with a warning) when it is corrupt or not ours."""
    import torch

    try:  # mmap: the weights stay in the file's pages until used (predict.py reads every checkpoint
        # first: 25 grown checkpoints of deberta-v3-base are ~18.5 GB, Kaggle has 30 GB of RAM)
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # truncated, foreign or tampered file: skip it, keep the others
        why = (str(e).strip().splitlines() or ["the file is empty or cut short"])[0][:120]
        print(f"WARNING: skipping {path}: cannot load ({type(e).__name__}: {why})")
        return None
    if not isinstance(ckpt, dict) or not {"model", "config", "classes"} <= ckpt.keys():
        print(f"WARNING: skipping {path}: not a kagtpl checkpoint (no model/config/classes)")
        return None
    if not isinstance(ckpt["config"], dict) or not isinstance(ckpt["classes"], list) or not ckpt["model"]:
        print(f"WARNING: skipping {path}: its config, classes or weights are empty or malformed")
        return None
    return ckpt


def fold_is_done(path: Path, config: dict, same_keys) -> bool:
    """A rerun skips a fold whose checkpoint is complete, not a dry run, and made with the same split."""
    return finished_fold(path, config, same_keys) is not None


def finished_fold(path: Path, config: dict, same_keys) -> dict | None:
    """fold_is_done's checkpoint (its recorded timing is a rerun's measure), or None when the fold
    must be trained."""
    if not Path(path).exists():
        return None
    ckpt = load_checkpoint(path)
    if ckpt is None or not ckpt.get("complete") or ckpt["config"].get("dry_run"):
        return None
    differ = differing_keys(ckpt, config, same_keys)
    if "signature" in differ:  # the data changed under it (relabelled or added rows, a new class)
        made = ckpt["config"].get("signature")
        print(
            f"FOLD: {Path(path).name} was trained with run signature {made}, this run is {config.get('signature')} "
            f"(other data, target or folds): retrained"
        )
    elif differ:  # another --lr, --epochs, model...: this run's settings train it
        print(
            f"FOLD: {Path(path).name} was trained with other settings ({settings_said(ckpt, config, differ)}): retrained"
        )
    return None if differ else ckpt


# The flags a run replaces in its checkpoints' config with what it used (artifacts.checkpoint_config):
# --lr is the peak at an effective batch of 128, the LR used follows the batch this machine's probe
# chose. Their flags as given are kept under "given", and resume compares those: the used LR would
# retrain every fold after a restart whose probe chose another batch.
REPLACED_FLAGS = ("batch_size", "accum_steps", "lr")
UNRECORDED = object()  # a replaced flag's value in a checkpoint written before "given" was kept


def setting(config: dict, key: str):
    """A resume key's value in a checkpoint's config: a REPLACED_FLAGS flag as given, else as saved."""
    if key in REPLACED_FLAGS:
        return config.get("given", {}).get(key, UNRECORDED)
    return config.get(key)


def differing_keys(ckpt: dict, config: dict, keys) -> list[str]:
    """The resume keys a checkpoint's config holds otherwise than this run's `config` (a flag a
    checkpoint of an earlier kagtpl did not record as given is not compared: it resumes as it did)."""
    pairs = {k: (setting(ckpt["config"], k), setting(config, k)) for k in keys}
    return [k for k, (theirs, mine) in pairs.items() if UNRECORDED not in (theirs, mine) and theirs != mine]


def settings_said(ckpt: dict, config: dict, keys: list[str]) -> str:
    """`lr=0.01, this run 0.003; epochs=...` for the first three of `keys` (differing_keys)."""
    return "; ".join(f"{k}={setting(ckpt['config'], k)!r}, this run {setting(config, k)!r}" for k in keys[:3])


def fold_checkpoints(out_dir: Path) -> list[tuple[Path, dict]]:
    """Every model_fold*.pth in out_dir that loads, in fold order."""
    found = []
    for path in sorted(Path(out_dir).glob("model_fold*.pth"), key=lambda p: (len(p.name), p.name)):
        ckpt = load_checkpoint(path)
        if ckpt is not None:
            found.append((path, ckpt))
    return found


def same_run(found: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    """The checkpoints made with the newest one's configuration (its `run`: the split and the
    model); a fold left over from an earlier run with other folds, model or image size is
    skipped with a warning, never ensembled silently."""
    newest_ckpt = max(found, key=lambda pc: pc[0].stat().st_mtime)[1]
    newest, classes = newest_ckpt.get("run"), newest_ckpt["classes"]
    kept = []
    for path, ckpt in found:
        run = ckpt.get("run")
        if run is None or newest is None:  # no record: it is the newest's kind only when neither has one
            differ = [] if run == newest else None
        else:
            differ = run_differences(run, newest)
        if differ == [] and ckpt["classes"] == classes:
            kept.append((path, ckpt))
            continue
        if differ == []:
            diff = f"classes {ckpt['classes'][:5]}..., newest {classes[:5]}..."
        elif differ is None:
            diff = "no record of its configuration"
        else:
            if len(differ) > 1 and "signature" in differ:  # it follows the flags named beside it
                differ.remove("signature")
            diff = "; ".join(f"{k}={run.get(k)!r}, newest {newest.get(k)!r}" for k in differ)
        print(f"WARNING: skipping {path}: trained with another configuration than the newest checkpoint ({diff})")
    return kept


def run_differences(run: dict, newest: dict) -> list[str]:
    """The keys of two checkpoints' `run` records that differ; a key one of them lacks (a checkpoint
    of an earlier kagtpl, which compared fewer) is not compared."""
    return [k for k in newest if k in run and run[k] != newest[k]]


def ensemble_checkpoints(out_dir: Path, required: bool = True) -> list[tuple[Path, dict]]:
    """predict.py's start: every loadable fold checkpoint of the newest run, announced; none at
    all is an error, unless not `required` (tables: the trees may have been trained alone).
    KeptFallback when the run judged them worse than its fallback, or none was ever validated."""
    from . import hand_in  # it writes through this module

    hand_in.check(out_dir)  # the run judged these checkpoints worse than its fallback: that stays
    found = fold_checkpoints(out_dir)
    if not found and not required:
        return []
    if not found:
        raise NothingTrained("loadable model_fold*.pth", out_dir)
    found = same_run(found)
    lost = hand_in.left_out(out_dir)  # grown seeds that lost on the OOF rows (artifacts.grown_gain_line)
    if any(p.name in lost for p, _ in found):
        print(
            f"ENSEMBLE: left out {', '.join(p.name for p, _ in found if p.name in lost)}: grown seeds that lost on the OOF rows ({hand_in.FILE})"
        )
        found = [(p, c) for p, c in found if p.name not in lost]
    unvalidated = [p.name for p, c in found if "val_loss" not in c]
    if unvalidated:  # cut inside its first epoch: no evidence it beats the fallback (a 1-epoch budget's)
        print(f"ENSEMBLE: left out {', '.join(unvalidated)}: never validated (stopped inside its first epoch)")
        found = [(p, c) for p, c in found if "val_loss" in c]
    if not found and not required:
        return []
    if not found:
        raise KeptFallback(
            f"SUBMISSION: {Path(out_dir) / 'submission.csv'} kept: no checkpoint was validated, so none is known to "
            f"beat train.py's fallback ({hand_in.fallback_in(out_dir)})"
        )
    cut = [p.name for p, c in found if c.get("seed_no", 1) > 1 and not c.get("complete")]
    if cut:  # growth.py's seeds count only for whole folds
        print(f"ENSEMBLE: left out {', '.join(cut)}: a grown seed's fold cut before its end")
        found = [(p, c) for p, c in found if p.name not in cut]
    names = ", ".join(p.name for p, _ in found)
    print(f"ENSEMBLE: {len(found)} checkpoint(s), folds {[c.get('fold') for _, c in found]}: {names}")
    if any(c["config"].get("dry_run") for _, c in found):
        print("WARNING: dry-run checkpoints (3 batches of training): fine for a smoke test, not for a score")
    for path, c in found:
        if not c.get("complete"):
            print(
                f"WARNING: {path.name} is from an incomplete fold (stopped early: its best epoch so far, {c.get('epoch')}); it is used"
            )
    return found


def restore(path: Path, build, state: dict, device):
    """build() -> model with the checkpoint's weights on `device`, or None with a warning when
    they do not fit (another head, missing or extra keys, an empty state): predict.py skips it
    like an unreadable file and ensembles the rest."""
    try:
        model = build()
        load_model_state(model, state)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        print(f"WARNING: skipping {path}: its weights do not fit the model ({str(e).splitlines()[0][:160]})")
        return None
    return model.to(device)
