"""Issue 57, item 3: the submission is never one the run's own evidence says is worse than the
fallback. The folds' OOF metric against the training prior's on the same rows (hand_in.py), and
checkpoints never validated (stopped inside their first epoch) left out of the ensemble."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import JUDGED_ENV, RUN_ENV, render, run_script
from kagtpl import table


def log_loss(y, pred):
    return {"Acc": float((pred.argmax(1) == y).mean()), "logloss": float(-np.log(pred[np.arange(len(y)), y]).mean())}


COMP = SimpleNamespace(classes=["a", "b", "c"], higher_is_better=False, score=log_loss)


def test_folds_worse_than_the_prior_on_their_oof_rows_hand_in_the_fallback(project_modules, tmp_path, capsys):
    hand_in, errors = project_modules.hand_in, project_modules.errors
    rng = np.random.default_rng(0)
    y = rng.choice(3, size=300, p=[0.6, 0.3, 0.1])
    prior, tiled = hand_in.prior_score(COMP, y, np.zeros((300, 3)))
    freq = np.bincount(y, minlength=3) / 300
    assert abs(prior - float(-np.log(freq[y]).mean())) < 1e-9  # the class frequencies, on the same rows
    assert np.allclose(tiled, freq)
    for k in (0, 1):
        torch.save(
            {"model": {"w": torch.zeros(1)}, "config": {}, "classes": COMP.classes}, tmp_path / f"model_fold{k}.pth"
        )
    confident_wrong = np.full((300, 3), 0.05)
    confident_wrong[np.arange(300), (y + 1) % 3] = 0.9  # a diverged epoch: sure, and wrong
    hand_in.judge(COMP, tmp_path, y, confident_wrong, log_loss(y, confident_wrong))
    said = capsys.readouterr().out
    assert said.startswith("HAND-IN: the fallback: the folds' OOF logloss 2.9957 is worse than the training prior's")
    assert re.search(r"\(in 100% of \d+ paired bootstrap resamples\)", said)
    with pytest.raises(
        errors.KeptFallback, match=r"kept: train.py's fallback \(the training prior\), because the folds'"
    ):
        hand_in.check(tmp_path)
    later = tmp_path / "model_fold1.pth"
    os.utime(later, ns=(later.stat().st_atime_ns, later.stat().st_mtime_ns + 10**9))  # retrained since
    hand_in.check(tmp_path)  # a judgment of other checkpoints: ignored
    tree = tmp_path / "test_lgbm_fold0.csv"  # a table's booster fold, by its test predictions (the blend's)
    tree.write_text("id,p_a\n1,0.5\n")
    hand_in.judge(COMP, tmp_path, y, confident_wrong, log_loss(y, confident_wrong))
    judged = set(hand_in.read(tmp_path)["fallback"]["checkpoints"])
    assert judged == {"model_fold0.pth", "model_fold1.pth", tree.name}
    with pytest.raises(errors.KeptFallback):
        hand_in.check(tmp_path)
    os.utime(tree, ns=(tree.stat().st_atime_ns, tree.stat().st_mtime_ns + 10**9))  # the booster fitted again
    hand_in.check(tmp_path)
    tree.unlink()
    capsys.readouterr()
    good = np.full((300, 3), 0.05)
    good[np.arange(300), y] = 0.9
    hand_in.judge(COMP, tmp_path, y, good, log_loss(y, good))  # better than the prior: the folds
    assert "fallback" not in hand_in.read(tmp_path) and "HAND-IN" not in capsys.readouterr().out
    hand_in.judge(COMP, tmp_path, y, confident_wrong, log_loss(y, confident_wrong))  # judged worse again
    text = (tmp_path / hand_in.FILE).read_text()
    capsys.readouterr()
    for damaged, why in (
        (text[: len(text) // 2], "JSONDecodeError"),
        ("", "empty: 0 bytes"),
        ("[1, 2]", "a JSON list"),
    ):
        (tmp_path / hand_in.FILE).write_text(
            damaged
        )  # cut short, emptied, garbled: no verdict, the folds are handed in
        hand_in.check(tmp_path)
        assert hand_in.left_out(tmp_path) == set() and hand_in.read(tmp_path) == {}
        said = capsys.readouterr().out.splitlines()  # read three times, said once
        assert len(said) == 1 and said[0].startswith(f"WARNING: {tmp_path / hand_in.FILE} does not read back ({why}"), (
            said
        )
        assert said[0].endswith(
            "no hand-in verdict applies (the folds and every grown seed count); "
            "a train.py run judges them again and writes it"
        )
    # boxes, and a table's MLP alone (judged with its boosters by the blend: `whole`) are not judged
    assert hand_in.prior_score(SimpleNamespace(**vars(COMP), oof_averages=False), y, good) is None
    mlp = SimpleNamespace(**vars(COMP), oof_names_model=True)
    assert hand_in.prior_score(mlp, y, good) is None and hand_in.prior_score(mlp, y, good, whole=True)[0] == prior


def test_folds_no_better_than_the_prior_within_noise_are_handed_in(project_modules, capsys, tmp_path):
    """The paired bootstrap: predictions whose per-row loss is the prior's plus noise of mean zero
    are not judged worse (the share of resamples they lose in is neither 0 nor 1); a confident,
    wrong model is judged worse in every resample (the test above)."""
    hand_in = project_modules.hand_in
    rng = np.random.default_rng(1)
    y = rng.choice(3, size=240)
    eps = rng.normal(0, 0.3, 240)
    sure = np.exp(eps - eps.mean()) / 3  # the true class's probability: 1/3 give or take, the prior's loss on average
    noisy = np.repeat(((1 - sure) / 2)[:, None], 3, axis=1)
    noisy[np.arange(240), y] = sure
    uniform = np.full((240, 3), 1 / 3)
    share, n = hand_in.worse_share(hand_in.last_metric(COMP), y, noisy, uniform, False)
    assert n == hand_in.RESAMPLES  # a fast metric: every resample
    assert 0.05 < share < hand_in.CONFIDENCE, share
    hand_in.judge(COMP, tmp_path, y, noisy, log_loss(y, noisy))
    assert "HAND-IN" not in capsys.readouterr().out and "fallback" not in hand_in.read(tmp_path)


def test_the_judge_stops_once_the_folds_cannot_lose_with_the_verdict_of_every_resample(project_modules):
    """judge's bootstrap (`decided`) ends once the folds have scored no worse than the prior in more
    resamples than a loser may (10 of 200): the verdict of all 200 resamples, in ~11 where the folds
    win. Checked against every resample on folds that win by far, lose by far, and sit on the line."""
    hand_in = project_modules.hand_in
    rng = np.random.default_rng(2)
    y = rng.choice(3, size=200)
    uniform = np.full((200, 3), 1 / 3)
    metric = hand_in.last_metric(COMP)
    verdicts = set()
    for shift in (-0.6, -0.15, -0.05, 0.0, 0.02, 0.05, 0.1, 0.6):  # the true class's share over the prior's 1/3
        sure = np.clip(1 / 3 + shift + rng.normal(0, 0.2, 200), 0.02, 0.98)
        pred = np.repeat(((1 - sure) / 2)[:, None], 3, axis=1)
        pred[np.arange(200), y] = sure
        full, n_full = hand_in.worse_share(metric, y, pred, uniform, False)
        quick, n_quick = hand_in.worse_share(metric, y, pred, uniform, False, decided=True)
        loses = full >= hand_in.CONFIDENCE
        assert loses == (quick >= hand_in.CONFIDENCE), (shift, full, quick, n_quick)
        assert n_quick == (n_full if loses else n_quick) and n_quick <= n_full, (shift, n_quick, n_full)
        verdicts.add((loses, n_quick < n_full))
    assert verdicts == {(True, False), (False, True)}, verdicts  # both verdicts met, and the quick one saved work
    sure = np.full(200, 0.9)  # far better than the prior: decided at the 11th resample
    pred = np.repeat(((1 - sure) / 2)[:, None], 3, axis=1)
    pred[np.arange(200), y] = sure
    assert hand_in.worse_share(metric, y, pred, uniform, False, decided=True) == (0.0, hand_in.LOSER_NOT_WORSE + 1)


def test_grown_seeds_that_lose_on_the_oof_rows_are_left_out_of_the_ensemble(project_modules, tmp_path, capsys):
    """Item 4: the grown seeds averaged in against the first seed alone, paired on the same rows:
    seeds that lose (the table's MLP: 0.9000 -> 0.8583) are left out of the OOF and of predict.py's
    ensemble; seeds within noise are kept."""
    artifacts, hand_in = project_modules.artifacts, project_modules.hand_in
    rng = np.random.default_rng(2)
    y = rng.choice(3, size=600)
    good = np.full((600, 3), 0.1)
    good[np.arange(600), y] = 0.8
    bad = np.full((600, 3), 0.1)
    bad[np.arange(600), (y + rng.integers(1, 3, 600)) % 3] = 0.8  # a seed that learned the wrong thing
    comp = SimpleNamespace(**vars(COMP), id_col="id", oof_columns=["a", "b", "c"])

    def frame(pred):
        cols = {c: pred[:, j] for j, c in enumerate("abc")}
        return pd.DataFrame({"id": np.arange(600), "fold": 0, "target": y, **cols})

    files = [tmp_path / "model_fold0_seed2.pth"]
    files[0].write_bytes(b"x")
    averaged = artifacts.average_seeds(comp, frame(good), [frame(bad)])
    assert not artifacts.grown_gain_line(comp, [(frame(good), averaged)], tmp_path, files)
    said = capsys.readouterr().out
    assert said.startswith("GROW: OOF logloss 0.2231 with one seed -> ")
    assert re.search(
        r"left out: worse in 100% of \d+ paired bootstrap resamples; predict.py leaves out their 1 file\(s\)", said
    )
    assert hand_in.left_out(tmp_path) == {"model_fold0_seed2.pth"}
    # two seeds as good, each sure by its own draw per row: averaged, within noise of the first
    first, second = (np.full((600, 3), 0.0) for _ in range(2))
    for pred in (first, second):
        sure = rng.uniform(0.5, 0.95, 600)
        pred += ((1 - sure) / 2)[:, None]
        pred[np.arange(600), y] = sure
    averaged = artifacts.average_seeds(comp, frame(first), [frame(second)])
    assert artifacts.grown_gain_line(comp, [(frame(first), averaged)], tmp_path, files)
    said = capsys.readouterr().out
    assert re.search(r": kept \(worse in \d+% of \d+ paired bootstrap resamples\)$", said, re.M), said
    assert hand_in.left_out(tmp_path) == set()


def test_mask_seeds_are_judged_on_their_folds_ensembled_rows_never_on_averaged_statistics(
    project_modules, tmp_path, capsys, monkeypatch
):
    """A mask's OOF row holds statistics, which do not average: its grown seeds were kept unjudged and
    postprocess.json was chosen on the first seeds' rows alone. Now seeds_oof.py's pass writes each
    fold's rows with its seeds ensembled (oof_fold{k}_seeds.csv): the seeds are judged on them (the
    seeds' own statistics files never averaged in), the thresholds are chosen on them while the seeds
    are kept, and a fold whose pass does not fit, or a stop, keeps its seeds unjudged, said so."""
    artifacts, seeds_oof = project_modules.artifacts, project_modules.seeds_oof
    rng = np.random.default_rng(3)
    y = rng.choice(3, size=600)
    comp = SimpleNamespace(**vars(COMP), id_col="id", oof_columns=["a", "b", "c"], oof_averages=False)

    def frame(true_share, name):
        pred = np.full((600, 3), (1 - true_share) / 2)
        pred[np.arange(600), y] = true_share
        cols = {c: pred[:, j] for j, c in enumerate("abc")}
        rows = pd.DataFrame({"id": np.arange(600), "fold": 0, "target": y, **cols})
        artifacts.storage.write_csv_atomic(artifacts.signed(rows, "sig"), tmp_path / name)

    files = [tmp_path / "model_fold0_seed2.pth"]
    files[0].write_bytes(b"x")
    frame(0.6, "oof_fold0.csv")
    frame(0.05, "oof_fold0_seed2.csv")  # statistics of the seed alone: never averaged in
    frame(0.7, "oof_fold0_seeds.csv")  # the fold's rows with both seeds ensembled
    first, ensembled = artifacts.seeds_averaged(comp, tmp_path, 0, "sig", {(0, 2)})
    assert np.allclose(ensembled["a"][y == 0], 0.7) and np.allclose(first["a"][y == 0], 0.6)
    assert artifacts.kept_seeds(comp, tmp_path, [0], "sig", {(0, 2)}) == {(0, 2)}
    assert re.search(r"^GROW: OOF logloss 0\.5108 with one seed -> 0\.3567 .*: kept", capsys.readouterr().out, re.M)
    assert np.allclose(artifacts.signed_oof(tmp_path, "sig")["a"][y == 0], 0.7)  # what postprocess.json is chosen on
    assert artifacts.seeds_averaged(comp, tmp_path, 0, "sig", set())[1] is None  # no seed counts: the first's rows
    frame(0.4, "oof_fold0_seeds.csv")  # ensembled, they lose: left out, and the thresholds' rows are the first's
    assert artifacts.kept_seeds(comp, tmp_path, [0], "sig", {(0, 2)}) == set()
    assert "left out: worse in 100% of" in capsys.readouterr().out
    assert not (tmp_path / "oof_fold0_seeds.csv").exists()
    assert np.allclose(artifacts.signed_oof(tmp_path, "sig")["a"][y == 0], 0.6)
    # a fold's ensembled rows cut short: the thresholds are chosen on its first seed's
    (tmp_path / "oof_fold0_seeds.csv").write_text("id,fold,tar")
    assert np.allclose(artifacts.signed_oof(tmp_path, "sig")["a"][y == 0], 0.6)
    assert capsys.readouterr().out.startswith("OOF: oof_fold0_seeds.csv left out: it does not read back (cut short")
    # the pass: an earlier run's rows removed as it starts; a stop, or a pass past the time left, is said
    reserve = project_modules.reserve.PredictionReserve(600)
    reserve.fold_s = 2.0
    planner = project_modules.planner.TimePlanner(600, 2, 3, prediction=reserve)
    before = planner.training_time()
    reserve.judge_grown(5.0)  # growth holds the pass from training: each grown checkpoint and its fold's first
    for _ in range(3):  # seeds grown on folds 0, 1, 0: 3 + 2 checkpoints, each 5x a checkpoint's share of 2s
        reserve.add_model()
    assert reserve.seconds(2) == 90 and before - planner.training_time() == (3 + 2) * 5 * 2.0
    reserve.extra_models = 0
    planner = SimpleNamespace(
        stop_reason="SIGTERM", training_left=lambda: 100.0, prediction=reserve, budget=60, folds=2
    )
    run = SimpleNamespace(args=SimpleNamespace(out_dir=str(tmp_path)), planner=planner)
    masks = SimpleNamespace(predict_ensemble=lambda models, batch: None, test_rows=60, test_views=2)
    splits = [(np.arange(300), np.arange(300, 600)), (np.arange(300), np.arange(300, 600))]
    seeds_oof.write(masks, splits, run, {(0, 2), (1, 2), (1, 3)})
    assert capsys.readouterr().out == "GROW: grown seeds of folds [0, 1] kept unjudged (SIGTERM)\n"
    assert not (tmp_path / "oof_fold0_seeds.csv").exists()
    planner.stop_reason = None  # fold 0's two checkpoints, 5x the test rows in one view of 2: ~10s, of 10s left
    planner.training_left = lambda: 10.0  # 95% of it: 9.5s
    seeds_oof.write(masks, splits, run, {(0, 2), (1, 2), (1, 3)})
    said = "GROW: grown seeds of folds [0, 1] kept unjudged (~10s for fold 0, 9.5s left for the passes)\n"
    assert capsys.readouterr().out == said
    seeds_oof.write(comp, splits, run, {(0, 2)})  # a competition whose seeds average: no pass, no line
    assert capsys.readouterr().out == ""
    # under DDP (an earlier run's seeds: DDP grows none) the other ranks would wait at the end past their
    # collectives' timeout while rank 0 made the passes: said, not made
    planner.training_left = lambda: 1e6
    monkeypatch.setenv("WORLD_SIZE", "2")
    seeds_oof.write(masks, splits, run, {(0, 2), (1, 2)})
    assert (
        capsys.readouterr().out
        == "GROW: grown seeds of folds [0, 1] kept unjudged (DDP: the other ranks wait for rank 0)\n"
    )


def test_a_stop_inside_the_seeds_pass_ends_it_at_the_next_batch(project_modules, tmp_path, capsys):
    """The seeds' pass (seeds_oof.py) predicts a fold's validation rows with every checkpoint of the
    fold: a large validation set's is minutes on a T4. A SIGTERM that came during it waited for
    the fold's end, past a container's grace; now the pass ends at the next batch, the fold's seeds
    are said unjudged, and no rows are written for it. Without a stop the rows are the checkpoints'
    predictions averaged. The TTA views' evidence (tta_views.fold_views), a pass a fold, the same."""
    import contextlib

    import torch

    seeds_oof, fold_module = project_modules.seeds_oof, project_modules.fold
    planner = SimpleNamespace(
        stop_reason=None, budget=None, folds=1, prediction=project_modules.reserve.PredictionReserve(0)
    )
    x = torch.arange(16, dtype=torch.float32).reshape(8, 2)

    class Tiny:  # a competition of 8 rows, a linear model a checkpoint, batches of 2 rows
        id_col, oof_columns, test_rows, test_views, batches = "id", ["pred"], 8, 1, 0

        def fold(self, k, trn, val):
            return fold_module.Fold(k, None, x[val], np.zeros(len(val)), np.asarray(val))

        def loader(self, rows, batch, train):
            return [(rows[i : i + batch],) for i in range(0, len(rows), batch)]

        def build_model(self, fold):
            return torch.nn.Linear(2, 1)

        def predict_ensemble(self, models, batch):
            self.batches += 1
            if self.batches == stop_at:
                planner.stop_reason = "SIGTERM"  # the signal handler's flag, as it comes mid-pass
            return torch.stack([m(batch[0]) for m in models]).mean(0)

        def predict_view(self, model, batch, view):
            return self.predict_ensemble([model], batch)

    for seed_no, w in ((1, 1.0), (2, 3.0)):
        state = {"weight": torch.full((1, 2), w), "bias": torch.zeros(1)}
        torch.save(
            {"model": state, "config": {"signature": "sig"}, "classes": [], "complete": True},
            tmp_path / f"model_fold0{'_seed2' * (seed_no > 1)}.pth",
        )
    run = SimpleNamespace(
        planner=planner,
        args=SimpleNamespace(out_dir=str(tmp_path), signature="sig"),
        machine=SimpleNamespace(
            device=torch.device("cpu"), channels_last=False, amp=SimpleNamespace(autocast=contextlib.nullcontext)
        ),
        batching=SimpleNamespace(eval_rows=2),
    )
    splits = [(np.arange(0), np.arange(8))]
    stop_at, comp = 2, Tiny()
    seeds_oof.write(comp, splits, run, {(0, 2)})
    assert comp.batches == 2  # of 4: the stop ended the pass at the next batch
    assert capsys.readouterr().out == "GROW: grown seeds of folds [0] kept unjudged (SIGTERM)\n"
    assert not (tmp_path / "oof_fold0_seeds.csv").exists()
    planner.stop_reason, stop_at, comp = None, 0, Tiny()
    seeds_oof.write(comp, splits, run, {(0, 2)})
    rows = pd.read_csv(tmp_path / "oof_fold0_seeds.csv")
    assert comp.batches == 4 and np.allclose(rows["pred"], x.sum(1).numpy() * 2.0)  # weights 1 and 3 averaged
    stop_at, comp = 3, Tiny()  # two views a batch: the stop in the second batch's second view
    assert project_modules.tta_views.fold_views(comp, 0, splits[0], ["image", "hflip"], run, tmp_path) is None
    assert comp.batches == 4  # of 8


def test_no_validated_checkpoint_names_the_fallback_its_run_wrote(project_modules, tmp_path):
    """predict.py with no validated checkpoint keeps train.py's fallback; its line said "the training
    prior" for masks and boxes too. serve_defaults.json's kind names what the fallback holds."""
    m = project_modules
    ckpt = {
        "model": {"w": torch.zeros(1)},
        "config": {"signature": "s"},
        "classes": ["a"],
        "fold": 0,
        "complete": False,
    }
    torch.save(ckpt, tmp_path / "model_fold0.pth")  # cut inside its first epoch: no val_loss
    sample = pd.DataFrame({"id": ["x", "y"], "rle": ["", ""]})
    for kind, words in (
        ("rle", "no mask or box"),
        ("box rows", "no mask or box"),
        ("distribution", "the training prior"),
    ):
        m.serving.write_defaults(tmp_path, sample, kind, "s")
        with pytest.raises(m.errors.KeptFallback, match=rf"so none is known to beat train.py's fallback \({words}\)$"):
            m.storage.ensemble_checkpoints(tmp_path)
    (tmp_path / "serve_defaults.json").write_text('{"id_col": "id", "val')  # cut short: the words most runs' have
    with pytest.raises(m.errors.KeptFallback, match=r"fallback \(the training prior\)$"):
        m.storage.ensemble_checkpoints(tmp_path)


def test_no_model_at_all_keeps_this_runs_fallback_under_run_py_and_only_then(project_modules, tmp_path):
    """predict.py found no model. Under run.py (in_run: --after-train) with the fallback written since its
    process started (train.py's, after preflight: a budget or a stop ended train.py before its first
    checkpoint), that file is handed in, exit 0. An earlier run's file, or none, is an error that
    points at the lines above (train.py's, run.py's); by hand, without run.py, the error says to run train.py first."""
    hand_in, errors = project_modules.hand_in, project_modules.errors
    none = errors.NothingTrained("loadable model_fold*.pth", tmp_path)
    assert str(none) == f"no loadable model_fold*.pth in {tmp_path}: run python train.py first (nothing was written)"
    elsewhere = errors.NothingTrained("loadable model_fold*.pth", tmp_path, "python train.py --out-dir 'exp 1'")
    assert str(elsewhere).endswith(": run python train.py --out-dir 'exp 1' first (nothing was written)")
    assert hand_in.untrained(none, in_run=False) is none
    missing = hand_in.untrained(none, in_run=True)
    assert type(missing) is errors.RunError and str(missing) == (
        f"no loadable model_fold*.pth in {tmp_path} and no fallback of this run: the lines above say why "
        "(train.py's, run.py's)"
    )
    (tmp_path / "submission.csv").write_text("id,a\n1,0.5\n")  # written now: since this process started
    kept = hand_in.untrained(none, in_run=True)
    assert isinstance(kept, errors.KeptFallback) and str(kept) == (
        f"SUBMISSION: {tmp_path}/submission.csv kept: train.py saved no model in this run, so its fallback is "
        "handed in (the lines above say why: train.py's, run.py's)"
    )
    assert hand_in.untrained(none, in_run=True, submission="other.csv").__class__ is errors.RunError
    os.utime(tmp_path / "submission.csv", (1e9, 1e9))  # an earlier run's file (2001)
    assert type(hand_in.untrained(none, in_run=True)) is errors.RunError


@pytest.mark.slow
def test_a_tables_blend_worse_than_the_prior_hands_in_the_fallback(tmp_path):
    """A table whose target is noise (the real table's labels shuffled), trained with the MLP alone
    (`--models mlp`): its OOF log loss is above the training prior's. The MLP was never judged (a
    table's models are judged together, by the blend) and was handed in; train.py now weighs the
    blend predict.py makes on the OOF rows and judges it against the prior, as every task's folds."""
    data = table.write_table(tmp_path / "data", "binary")
    train = pd.read_csv(data / "train.csv")
    train["target"] = np.random.default_rng(0).permutation(train["target"].to_numpy())
    train.to_csv(data / "train.csv", index=False)
    answers = {"task": "tabular", "gpu": "cpu", "problem": "binary", "metric": "logloss", "id_col": "row_id"}
    project = render(tmp_path / "proj", data_dir=str(data), target="target", **answers)
    out = tmp_path / "out"
    log = run_script(project, "run.py", "--device", "cpu", "--models", "mlp", f"--out-dir={out}", env=JUDGED_ENV).stdout
    oof = float(re.search(r"^OOF: logloss=([\d.]+) over \d+ rows from folds \[[\d, ]+\] \(mlp\)$", log, re.M)[1])
    said = re.search(
        r"^HAND-IN: the fallback: the folds' OOF logloss ([\d.]+) is worse than the training prior's ([\d.]+) on the "
        r"same (\d+) rows \(in (\d+)% of \d+ paired bootstrap resamples\); predict\.py keeps train\.py's fallback",
        log,
        re.M,
    )
    assert said and float(said[1]) == oof > float(said[2]) and int(said[4]) >= 95, log[-3000:]
    assert log.rstrip().splitlines()[-1] == (
        f"RUN: handed in {out}/submission.csv, this run's fallback (the training prior): "
        "predict.py kept it (its SUBMISSION line above says why)"
    ), log[-2000:]
    sub = pd.read_csv(out / "submission.csv")
    assert sub["target"].nunique() == 1  # the prior, every row alike
    # LightGBM trained next into the same folder: the blend predict.py makes is of both (an earlier run's models
    # join), judged as one; early stopping keeps the trees at the prior or better, so the blend is handed in
    lgbm = ["--device", "cpu", "--models", "lgbm", f"--out-dir={out}"]
    log = run_script(project, "run.py", *lgbm, env=JUDGED_ENV).stdout
    assert "HAND-IN" not in log and "BLEND: member mlp: OOF logloss=" in log, log[-3000:]
    assert re.search(r"^BLEND: weights .*lgbm.* -> OOF logloss=", log, re.M), log[-3000:]
    assert re.search(r"^SUBMISSION: \S+ \(113 rows, \d+ fold\(s\) ensembled\)$", log, re.M), log[-3000:]
    assert pd.read_csv(out / "submission.csv")["target"].nunique() > 1
    # the MLP alone again (its folds complete: skipped): judged with the trees an earlier run left, as predict.py
    # blends them, not alone (which would keep the fallback over a blend that is not worse than the prior)
    log = run_script(project, "run.py", *lgbm[:2], "--models", "mlp", f"--out-dir={out}", env=JUDGED_ENV).stdout
    assert "HAND-IN" not in log and "is complete, skipping (resume)" in log, log[-3000:]
    assert re.search(r"^SUBMISSION: \S+ \(113 rows, \d+ fold\(s\) ensembled\)$", log, re.M), log[-3000:]


@pytest.mark.slow
def test_predict_keeps_the_fallback_over_folds_judged_worse_or_never_validated(tmp_path, digits_dir):
    """The issue's run, for real: folds that learned nothing useful (one epoch at LR 3: OOF log
    loss ~31 against the prior's 2.28 on the digits) are judged by train.py, and run.py hands in
    the fallback with one line saying why. A checkpoint never validated is left out by predict.py;
    with no checkpoint at all, predict.py under run.py keeps the fallback train.py wrote."""
    project = render(tmp_path / "proj", data_dir=str(digits_dir))
    out = tmp_path / "out"
    flags = ["--device", "cpu", f"--out-dir={out}", "--epochs", "1", "--folds", "2", "--lr", "3", "--no-grow"]
    log = run_script(project, "run.py", "--budget", "3m", *flags, env=JUDGED_ENV).stdout
    assert re.search(
        r"^HAND-IN: the fallback: the folds' OOF logloss \d+\.\d{4} is worse than the training prior's 2\.\d{4} on "
        r"the same 240 rows \(in 100% of \d+ paired bootstrap resamples\); predict.py keeps train.py's fallback",
        log,
        re.M,
    ), log[-3000:]
    kept = r"^SUBMISSION: \S+ kept: train.py's fallback \(the training prior\), because the folds'"
    assert re.search(kept, log, re.M), log[-3000:]
    assert log.rstrip().splitlines()[-1] == (
        f"RUN: handed in {out}/submission.csv, this run's fallback (the training prior): "
        "predict.py kept it (its SUBMISSION line above says why)"
    ), log[-2000:]
    sub = pd.read_csv(out / "submission.csv")
    assert (sub.iloc[:, 1:].to_numpy() == sub.iloc[0, 1:].to_numpy()).all()  # the prior, every row alike
    fallback = (out / "submission.csv").read_bytes()
    r = run_script(project, "predict.py", "--device", "cpu", f"--out-dir={out}")  # predict.py alone: the same
    assert r.stdout.strip().splitlines()[-1].endswith(f"({out}/hand_in.json; delete it to hand in the folds)")
    assert (out / "submission.csv").read_bytes() == fallback and "ENSEMBLE" not in r.stdout
    # the verdict cut short (a full disk, a copy stopped midway): no verdict, said in one line; the folds
    verdict = (out / "hand_in.json").read_text()
    (out / "hand_in.json").write_text(verdict[: len(verdict) // 2])
    r = run_script(project, "predict.py", "--device", "cpu", f"--out-dir={out}")
    said = [line for line in r.stdout.splitlines() if "hand_in.json" in line]
    assert said == [
        f"WARNING: {out}/hand_in.json does not read back (JSONDecodeError): no hand-in verdict applies (the folds "
        "and every grown seed count); a train.py run judges them again and writes it"
    ], r.stdout[-3000:]
    assert f"SUBMISSION: {out}/submission.csv (" in r.stdout and "ENSEMBLE: 2 checkpoint(s)" in r.stdout
    (out / "hand_in.json").unlink()
    (out / "submission.csv").write_bytes(fallback)  # train.py's, as below expects
    # a budget smaller than one epoch: a checkpoint from inside the first epoch has no val loss
    cut = tmp_path / "cut"
    shutil.copytree(out, cut, ignore=shutil.ignore_patterns(".train.lock"))
    for path in cut.glob("model_fold*.pth"):
        ckpt = torch.load(path, weights_only=True)
        del ckpt["val_loss"]
        ckpt["complete"] = False
        torch.save(ckpt, path)
    r = run_script(project, "predict.py", "--device", "cpu", f"--out-dir={cut}")
    lines = r.stdout.strip().splitlines()
    assert (
        "ENSEMBLE: left out model_fold0.pth, model_fold1.pth: never validated (stopped inside its first epoch)" in lines
    )
    assert lines[-1].startswith(f"SUBMISSION: {cut}/submission.csv kept: no checkpoint was validated")
    assert lines[-1].endswith("so none is known to beat train.py's fallback (the training prior)"), lines[-1]
    assert (cut / "submission.csv").read_bytes() == fallback
    sub = pd.read_csv(cut / "submission.csv")
    assert (sub.iloc[:, 1:].to_numpy() == sub.iloc[0, 1:].to_numpy()).all()  # the prior, every row alike
    # no checkpoint at all (a budget or a stop ended train.py before one): predict.py as run.py
    # starts it (--after-train, its go on stdin) with the fallback written after its start, as
    # train.py writes it after preflight
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "predict.py", "--device", "cpu", f"--out-dir={empty}", "--after-train"],
        cwd=project,
        env=RUN_ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)  # train.py writes its fallback after its preflight: seconds after predict.py starts
    (empty / "submission.csv").write_bytes(fallback)
    stdout, stderr = proc.communicate("go\n", timeout=300)
    assert proc.returncode == 0, stdout + stderr
    assert stdout.strip().splitlines()[-1] == (
        f"SUBMISSION: {empty}/submission.csv kept: train.py saved no model in this run, so its fallback is handed "
        "in (the lines above say why: train.py's, run.py's)"
    )
    assert (empty / "submission.csv").read_bytes() == fallback
