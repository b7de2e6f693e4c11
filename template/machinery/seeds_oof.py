"""A fold's grown seeds ensembled on its OOF rows, where their own OOF files cannot be averaged.

A table's, a text's or an image's grown seeds are judged on their OOF predictions averaged with
the first seed's (artifacts.seeds_averaged). A mask's OOF row holds statistics (the Dice terms at
every threshold), not its probabilities: the mean of two seeds' statistics is not the statistics
of their averaged probabilities, which is what predict.py hands in. Where the competition says
how its checkpoints ensemble on a batch (`predict_ensemble(models, batch)`), each fold with grown
seeds gets one more validation pass at train.py's end, every checkpoint of the fold at once, and
its rows go to oof_fold{k}_seeds.csv: the GROW: OOF line judges the seeds on them, oof.csv holds
them, and postprocess.json's threshold and minimum area are chosen on what predict.py averages.
Growth holds the passes' time from training as it adds seeds (reserve.PredictionReserve.judging_s);
the passes spend it, a fold's while it fits; folds past it, or past a stop (SIGTERM, the deadline),
keep their seeds unjudged, as before this step. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from . import artifacts, growth, parallel, storage
from .gpu import free_gpu_memory
from .planner import fmt_s
from .steps import loader, predict


def forget(out: Path) -> None:
    """Every earlier run's ensembled rows removed as the step starts: a file there is this run's."""
    for path in Path(out).glob("oof_fold*_seeds.csv"):
        path.unlink(missing_ok=True)


def judged(comp) -> bool:
    return callable(getattr(comp, "predict_ensemble", None))


def rows_share(comp, splits: list) -> float:
    """A checkpoint's pass over a fold's validation rows in predict.py's share of a checkpoint: the
    largest fold's rows over the test rows (never under one: the model's build), in the views
    validation predicts (`valid_views`: segmentation's and detection's each of predict.py's; one
    elsewhere) of predict.py's test_views."""
    rows = max(1.0, max(len(val) for _, val in splits) / max(comp.test_rows, 1))
    return rows * getattr(comp, "valid_views", 1) / max(1, comp.test_views)


def by_fold(counted: set) -> dict[int, list[int]]:
    """The grown seeds that count (artifacts.grown_seeds' (fold, seed) pairs), by fold."""
    return {k: sorted(s for f, s in counted if f == k) for k in sorted({f for f, _ in counted})}


def fold_rows(comp, k: int, split: tuple, seeds: list[int], run, out: Path) -> tuple | None:
    """Fold k's validation rows predicted by its first seed's checkpoint and `seeds`' ensembled
    (comp.predict_ensemble): (the fold, the rows); None when a checkpoint does not read back, or
    a stop came during the pass (it ends at the next batch: a large validation set's pass with five
    checkpoints is minutes on a T4, past a container's grace)."""
    machine = run.machine  # run: runs.Run
    fold, models = comp.fold(k, *split), torch.nn.ModuleList()
    for seed_no in (1, *seeds):
        model = storage.load_fold_model(
            out / growth.checkpoint_name(k, seed_no), lambda: comp.build_model(fold), machine
        )
        if model is None:
            return None
        models.append(model)
    batches = loader(comp, fold.valid, run.batching.eval_rows, False, None)
    going = lambda _rows: not run.planner.stop_reason  # noqa: E731
    rows = predict(lambda ms, batch: comp.predict_ensemble(list(ms), batch), models, batches, machine, None, going)
    del models
    free_gpu_memory()  # the next fold's checkpoints, then predict.py, have the card
    return None if rows is None else (fold, rows)


def write(comp, splits: list, run, counted: set) -> None:
    """oof_fold{k}_seeds.csv for each fold with grown seeds, while the passes fit the time growth
    held for them and FIT_FRACTION of the training time left (no budget: always) and no stop came;
    a GROW line names the folds left."""
    out, planner = Path(run.args.out_dir), run.planner
    forget(out)
    if not judged(comp):
        return
    folds, done, took, passes = by_fold(counted), [], 0.0, 0
    # DDP grows no seeds, but an earlier run's count: the other ranks would wait for rank 0's passes in
    # a collective whose timeout (PyTorch's 10 minutes) a pass over every fold's seeds may pass
    if folds and parallel.world_size() > 1:
        print(f"GROW: grown seeds of folds {list(folds)} kept unjudged (DDP: the other ranks wait for rank 0)")
        return
    held = planner.prediction.judging_s(planner.folds)  # what growth held from training for the passes
    spare = held + growth.FIT_FRACTION * max(0.0, planner.training_left()) if planner.budget else math.inf
    for k, seeds in folds.items():
        each = took / passes if passes else planner.prediction.fold_s * rows_share(comp, splits)  # a checkpoint's
        price, found = each * (1 + len(seeds)), None
        fits = not planner.stop_reason and took + price <= spare
        if fits:
            t0 = time.time()
            found = fold_rows(comp, k, splits[k], seeds, run, out)
            took, passes = took + time.time() - t0, passes + 1 + len(seeds)
        if planner.stop_reason or not fits:  # a stop inside the pass: this fold's seeds are unjudged too
            why = planner.stop_reason or f"~{fmt_s(price)} for fold {k}, {fmt_s(spare - took)} left for the passes"
            print(f"GROW: grown seeds of folds {[f for f in folds if f not in done]} kept unjudged ({why})")
            return
        if found is not None:
            fold, rows = found
            artifacts.write_oof(comp, fold, fold.y_valid, rows, out / growth.seeds_oof_name(k), run.args)
        done.append(k)
