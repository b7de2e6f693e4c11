"""Growing predict.py's TTA views on the OOF rows' evidence (docs/time-budget.md, "Growth").

A competition that names its views (train.py's `tta_views`, the plan's first `test_views` of them,
and `predict_view(model, batch, view)`) may have predict.py average more of them than the plan's.
Before any grown seed, each planned fold's best checkpoint predicts its own validation rows once a
view; the views predict.py will average are the first n with the lowest OOF val loss (the plan's
unless more are lower), written to output/tta_views.json for predict.py and serve.py, and the
reserve for predict.py grows by their measured share. Views go before seeds: their evidence costs
a validation pass a view and fold (seconds), and their price is known before any seed starts, so
every seed's fit check counts it. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from . import storage
from .gpu import free_gpu_memory
from .growth import FIT_FRACTION
from .planner import fmt_s
from .steps import loader, predict

FILE = "tta_views.json"


def planned(names: list[str], test_views: int) -> list[str]:
    return list(names[: max(1, test_views)])


def read(out: Path, signature: str, plan: list[str], known: list[str]) -> list[str]:
    """The views predict.py averages: tta_views.json's when this run's (signature) chose them
    from views the competition still has, else the plan's."""
    path = Path(out) / FILE
    if not path.is_file():
        return plan
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # cut short, not JSON, not UTF-8
        print(f"WARNING: {path} does not read ({type(e).__name__}): the plan's views")
        return plan
    if not isinstance(found, dict) or found.get("signature") != signature:
        return plan
    views = found.get("views")
    if not isinstance(views, list) or not views or not all(isinstance(v, str) and v in known for v in views):
        print(f"WARNING: {Path(out) / FILE}: not a list of this task's views ({str(views)[:80]}): the plan's views")
        return plan
    return views


def write(out: Path, views: list[str], signature: str, losses: dict[int, float]) -> None:
    text = json.dumps({"views": views, "signature": signature, "oof_val_loss": losses}, indent=1)
    if (Path(out) / FILE).is_dir():  # forget() said so: predict.py averages the plan's views
        return
    storage.atomic_write(Path(out) / FILE, lambda tmp: Path(tmp).write_text(text))


def forget(out: Path) -> None:
    """An earlier run's choice removed (cross_validate, as a run starts): until this run's growth
    chooses, predict.py averages the plan's views."""
    path = Path(out) / FILE
    if path.is_dir():  # not ours: a folder where the file goes is left alone, and nothing is written there
        print(f"WARNING: {path} is a folder, not growth's file: TTA views stay the plan's")
        return
    path.unlink(missing_ok=True)


def choose(losses: dict[int, float], plan: int) -> int:
    """How many views to average: the count (the first n views) with the lowest OOF val loss;
    the plan's on a tie or when none is lower."""
    best = plan
    for n in sorted(losses):
        if n > plan and losses[n] < losses[best]:
            best = n
    return best


def affordable(planner, plan: int, n: int) -> bool:
    """n views instead of the plan's fit: predict.py's extra share for every checkpoint it will
    ensemble within FIT_FRACTION of the training time left. The plan's own views always do (the
    evidence may have spent the last of the training time: choose() needs the plan's count)."""
    extra = (planner.folds + planner.prediction.extra_models) * planner.prediction.fold_s * (n / plan - 1)
    return n <= plan or extra <= FIT_FRACTION * planner.training_left()


def evidence_s(planner, views: tuple[int, int], rows_share: float, took: float, folds: int) -> float:
    """A fold's evidence: as measured on the folds before, else predict.py's measured share of one
    checkpoint at the plan's views, scaled to every view and to the fold's validation rows
    (`rows_share`: its rows / the test rows; never under one checkpoint's share: the model's build)."""
    if folds:
        return took / folds
    plan, every = views
    return planner.prediction.fold_s * every / plan * max(1.0, rows_share)


def fold_views(comp, k: int, split: tuple, names: list[str], run, out: Path) -> tuple | None:
    """Fold k's best checkpoint's predictions of its validation rows, one array per view, and
    their targets; None when the checkpoint cannot be read, or a stop came during the pass (it
    ends at the next batch)."""
    machine, batching = run.machine, run.batching  # run: runs.Run
    fold = comp.fold(k, *split)
    model = storage.load_fold_model(out / f"model_fold{k}.pth", lambda: comp.build_model(fold), machine)
    if model is None:
        return None
    batches = loader(comp, fold.valid, batching.eval_rows, False, None)

    def every_view(model, batch) -> torch.Tensor:  # (rows, views, columns): one loader pass, not one a view
        return torch.stack([comp.predict_view(model, batch, view) for view in names], 1)

    stacked = predict(every_view, model, batches, machine, None, lambda _rows: not run.planner.stop_reason)
    del model
    free_gpu_memory()  # one fold's model on the card at a time, then the grown seeds' training
    return None if stacked is None else (fold.y_valid, [stacked[:, v] for v in range(len(names))])


def evidence(comp, splits: list, names: list[str], plan: int, run, out: Path, folds: list[int]) -> tuple:
    """The predictions of `folds`' validation rows, a view at a time, while a fold's evidence fits
    the training time left and no stop came (SIGTERM, the deadline: a large validation set's pass
    a fold is minutes on a T4, past a container's grace). Returns (folds used, OOF val loss by views
    averaged, seconds)."""
    planner, ys, preds, used, took = run.planner, [], [[] for _ in names], [], 0.0
    for k in folds:
        split = splits[k]
        rows_share = len(split[1]) / max(comp.test_rows, 1)
        price = evidence_s(planner, (plan, len(names)), rows_share, took, len(used))
        if planner.stop_reason or price > FIT_FRACTION * planner.training_left():
            break
        t0 = time.time()
        found = fold_views(comp, k, split, names, run, out)
        took += time.time() - t0
        if found is not None:
            ys.append(found[0])
            for v, p in enumerate(found[1]):
                preds[v].append(p)
            used.append(k)
    if not used:
        return used, {}, took
    y, stacked = np.concatenate(ys), [np.concatenate(p) for p in preds]
    return used, {n: float(comp.val_loss(y, np.mean(stacked[:n], axis=0))) for n in range(plan, len(names) + 1)}, took


def growable(comp) -> bool:
    """Whether the competition names more views than the plan averages: only then is there a
    choice to make (and, on fold workers, to claim)."""
    names = list(getattr(comp, "tta_views", []))
    return len(names) > len(planned(names, comp.test_views)) if names else False


def grow(comp, splits: list, run, folds: list[int] | None = None) -> float:
    """The views step of `run` (runs.Run): the evidence on `folds` (every fold of the split; a fold
    worker's: those complete when it chooses), the choice (the best that fits), its file and its GROW
    line. Returns the views chosen over the plan's (1.0: the plan's), the factor predict.py's share
    of a checkpoint grew by."""
    if not growable(comp):
        return 1.0
    names, planner, out = list(comp.tta_views), run.planner, Path(run.args.out_dir)
    plan = planned(names, comp.test_views)
    folds = list(range(len(splits))) if folds is None else folds
    used, losses, took = evidence(comp, splits, names, len(plan), run, out, folds)
    if not used:
        why = planner.stop_reason or "no fold's evidence fits"
        print(f"GROW: TTA views stay {', '.join(plan)} ({why})")
        return 1.0
    best = choose(losses, len(plan))
    n = choose({m: v for m, v in losses.items() if affordable(planner, len(plan), m)}, len(plan))
    said = ", ".join(f"{v:.4f} with {m}" for m, v in losses.items())
    where = f"OOF val loss {said} (folds {used}, {fmt_s(took)})"
    if n == len(plan):
        price = f"; {best} views do not fit predict.py's time" if best > n else ""
        print(f"GROW: TTA views stay {', '.join(plan)}: {where}{price}")
    else:
        before = planner.reserve()
        planner.prediction.set_view_factor(n / len(plan))  # and every later measure of a fold's share
        print(f"GROW: TTA views {', '.join(names[:n])}: {where}; reserve {fmt_s(before)} -> {fmt_s(planner.reserve())}")
    write(out, names[:n], run.args.signature, losses)
    return n / len(plan)
