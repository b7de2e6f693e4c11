"""Files that must survive a kill: checkpoints and CSVs, written to a temporary file and renamed.

A checkpoint holds the state_dict, the resolved config and the class list: predict.py rebuilds
the model from it alone. Loading uses torch.load(weights_only=True), so a tampered file can
not run code. torch is imported only where a checkpoint is read or written, so the CSV writers
(submission.py, experiments.py) stay torch-free. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from errors import RunError


def atomic_write(path: Path, write_fn) -> None:
    """write_fn(tmp_path) writes the file; it only replaces `path` once complete, so a
    kill at any moment leaves either the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_fn(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_csv_atomic(df, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


def save_checkpoint(path: Path, model, config: dict, classes: list, **meta) -> None:
    """state_dict + resolved config + class list: predict.py rebuilds the model from this alone."""
    import torch

    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {"model": state, "config": config, "classes": list(classes), **meta}
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def mark_complete(path: Path) -> bool:
    """Flag a fold's best checkpoint as complete (a rerun then skips the fold)."""
    import torch

    if not Path(path).exists():
        return False
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    ckpt["complete"] = True
    atomic_write(path, lambda tmp: torch.save(ckpt, tmp))
    return True


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint, or None (with a warning) when it is corrupt or not ours."""
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, foreign or tampered file: skip it, keep the others
        print(f"WARNING: skipping {path}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
        return None
    if not isinstance(ckpt, dict) or not {"model", "config", "classes"} <= ckpt.keys():
        print(f"WARNING: skipping {path}: not a kagtpl checkpoint (no model/config/classes)")
        return None
    return ckpt


def fold_is_done(path: Path, config: dict, same_keys) -> bool:
    """A rerun skips a fold whose checkpoint is complete, not a dry run, and made with the same split."""
    if not Path(path).exists():
        return False
    ckpt = load_checkpoint(path)
    if ckpt is None or not ckpt.get("complete") or ckpt["config"].get("dry_run"):
        return False
    return all(ckpt["config"].get(k) == config.get(k) for k in same_keys)


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
    newest = max(found, key=lambda pc: pc[0].stat().st_mtime)[1].get("run")
    kept = []
    for path, ckpt in found:
        run = ckpt.get("run")
        if run == newest:
            kept.append((path, ckpt))
            continue
        if run is None or newest is None:
            diff = "no record of its configuration"
        else:
            diff = ", ".join(
                f"{k}={run.get(k)!r}, newest {newest.get(k)!r}" for k in newest if run.get(k) != newest.get(k)
            )
        print(f"WARNING: skipping {path}: trained with another configuration than the newest checkpoint ({diff})")
    return kept


def ensemble_checkpoints(out_dir: Path) -> list[tuple[Path, dict]]:
    """predict.py's start: every loadable fold checkpoint of the newest run, announced; none at
    all is an error."""
    found = fold_checkpoints(out_dir)
    if not found:
        raise RunError(f"no loadable model_fold*.pth in {out_dir}: run train.py first (nothing was written)")
    found = same_run(found)
    names = ", ".join(p.name for p, _ in found)
    print(f"ENSEMBLE: {len(found)} checkpoint(s), folds {[c.get('fold') for _, c in found]}: {names}")
    if any(c["config"].get("dry_run") for _, c in found):
        print("WARNING: dry-run checkpoints (3 batches of training): fine for a smoke test, not for a score")
    return found
