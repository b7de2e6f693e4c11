"""Tier 3: render a project and run its train.py and predict.py as subprocesses on CPU, on a
small real dataset (UCI digits in the dog-breed layout)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import RUN_ENV, render, run_script, start_until

pytestmark = pytest.mark.slow

CPU = ["--device", "cpu"]


def assert_valid_submission(project, data_dir, out: str = "output"):
    sub = pd.read_csv(project / out / "submission.csv", dtype={"id": str})
    sample = pd.read_csv(data_dir / "sample_submission.csv", dtype={"id": str})
    assert list(sub.columns) == list(sample.columns) and list(sub["id"]) == list(sample["id"])
    probs = sub[sample.columns[1:]].to_numpy()
    assert ((probs >= 0) & (probs <= 1)).all() and abs(probs.sum(1) - 1).max() < 1e-6
    return sub


def test_dry_run_then_predict(project, digits_dir):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "kagtpl new"], cwd=project, check=True)
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], cwd=project, capture_output=True, text=True).stdout
    log = run_script(project, "train.py", "--dry-run", *CPU).stdout
    lines = log.splitlines()
    assert lines[0] == "PARALLEL: none (one device (cpu))"  # the run's shape comes first
    assert lines[1] == "COMPILE: off (auto: cpu: compiling costs ~40 s there and gains little)"
    assert lines[2] == (  # a folder of its own (issue 47): a trained run's files are never touched
        "DRY RUN: everything goes to output/dry-run, its own folder (a trained run's files are never touched); "
        "python predict.py --out-dir output/dry-run predicts with it"
    )
    assert "RESOURCES: " in lines[3] and "batch=32, GPU=none, Mixed Precision=OFF" in lines[3]
    assert lines[4] == "GPU Memory: none"
    assert lines[5] == (  # the CPU trains: no loader worker by the rule (hardware.flag_loader)
        "DataLoader: num_workers=0, prefetch_factor=None, persistent_workers=False "
        "(the CPU trains: a loader worker would take a core from it; --workers N for N)"
    )
    out = project / "output" / "dry-run"
    assert not (project / "output" / "model_fold0.pth").exists()
    assert re.search(r"^Model: test_resnet \(0\.4M params, small model\)$", log, re.M)
    assert "GPU Memory Used: none (CPU run)" in log
    epochs = re.findall(
        r"^Epoch 1: Loss=[\d.]+, ValLoss=([\d.]+), logloss=\1, LR=\S+, Time=[\d.]+s, "
        r"Throughput=\d+ samples/s, GPU=none$",
        log,
        re.M,
    )
    assert len(epochs) == 2  # 2 folds x 1 epoch
    assert "FOLD 0 (1 of 2)" in log and "FOLD 1 (2 of 2)" in log and "OOF: Acc=" in log
    records = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [(r["fold"], r["epoch"]) for r in records] == [(0, 1), (1, 1)]
    assert records[0]["gpu_used_gb"] is None and records[0]["samples_per_s"] > 0
    ckpt = torch.load(out / "model_fold0.pth", weights_only=True)
    assert ckpt["classes"][:3] == ["zero", "one", "two"] and ckpt["complete"] is True
    assert ckpt["config"]["model"] == "test_resnet" and ckpt["config"]["dry_run"] is True
    assert not list((project / "output").rglob("*.tmp")) and not list((project / "output").rglob(".*.tmp"))

    # the run's own log, output/train.log: every line of its stdout; kagtpl doctor reads it by
    # default, and the JSON log too, each with the batch the run ended with (RESOURCES said 32)
    assert set(lines) <= set((out / "train.log").read_text().splitlines())
    for given in (["output/dry-run/train.log"], ["output/dry-run/train_log.jsonl"]):
        doc = subprocess.run(
            [sys.executable, "-m", "kagtpl", "doctor", *given], cwd=project, capture_output=True, text=True
        )
        assert doc.returncode == 0, doc.stderr
        assert "GPU: none (CPU run), ? GB, batch 8" in doc.stdout and "STATUS: OK" in doc.stdout

    assert "REPORT: output/dry-run/train_report.png" in log
    png = (out / "train_report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    # the last line says what to run next, and it predicts from the dry run's folder (it said plain
    # `python predict.py` once: the trained run's folder, where a dry run has written nothing)
    done = re.fullmatch(r"DONE: 2 folds in [\d.]+s; next: python (predict\.py --out-dir output/dry-run)", lines[-1])
    assert done, lines[-1]
    pred = run_script(project, *done.group(1).split(), *CPU).stdout
    assert "ENSEMBLE: 2 checkpoint(s), folds [0, 1]" in pred
    assert "SUBMISSION: " in pred
    assert_valid_submission(project, digits_dir, "output/dry-run")

    # a deadline already passed (a slowed machine): TTA off, then only the best fold, still a submission
    losses = {k: torch.load(out / f"model_fold{k}.pth", weights_only=True)["val_loss"] for k in (0, 1)}
    late = run_script(project, "predict.py", *CPU, "--out-dir", "output/dry-run", f"--deadline={time.time()}").stdout
    assert "TTA off (one view per row)" in late and "PREDICT: deadline: 1 of 2 fold(s) used" in late
    assert f"PREDICT: model_fold{min(losses, key=losses.get)}.pth -> 40 rows" in late
    assert "SUBMISSION: output/dry-run/submission.csv (40 rows, 1 fold(s) ensembled)" in late
    assert_valid_submission(project, digits_dir, "output/dry-run")

    # the run's row in the experiments table, with the commit it ran at
    rows = pd.read_csv(out / "experiments.csv", dtype=str)
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row["git"] == sha.strip() and row["task"] == "image" and row["model"] == "test_resnet"
    assert (row["input"], row["batch"], row["folds_done"], row["epochs_done"]) == ("32px", "8x1", "2", "1 1")
    # the dog-breed layout submits probabilities: the competition's metric, last and ranked by, is log loss
    oof = float(re.search(r"^OOF: Acc=[\d.]+, logloss=([\d.]+)", log, re.M).group(1))
    assert abs(float(row["cv"]) - oof) < 1e-4 and row["metric"] == "logloss" and row["stop"] == "dry run"
    over = re.search(r"^OOF: .* over (\d+) rows from folds \[0, 1\]$", log, re.M).group(1)
    assert len(row["fold_scores"].split()) == 2 and row["oof_rows"] == over  # the dry run's validation batches
    table = run_script(project, "-m", "machinery.experiments", "--out-dir", "output/dry-run").stdout.splitlines()
    assert table[0].split()[:3] == ["time", "git", "model"] and len(table) == 2
    # without --out-dir: none in output/ yet, and the line names the folder that has runs, not "run train.py"
    empty = run_script(project, "-m", "machinery.experiments").stdout.strip()
    way = "python -m machinery.experiments --out-dir output/dry-run"
    assert empty == f"no runs recorded yet in output/experiments.csv: other folders have runs: {way}", empty


def test_a_dry_run_on_rows_in_class_order_validates_a_sample_of_each_fold(project, digits_dir, tmp_path):
    """A dry run validates 2 batches of each fold. On rows in class order (a labels file sorted by
    label, class folders) those were the fold's first rows, one class or a few, and the OOF line
    said Acc=0.0000 of a path that works. Now they are a seeded sample of the fold (fold.dry_run_rows)."""
    data = Path(shutil.copytree(digits_dir, tmp_path / "data"))
    labels = pd.read_csv(data / "labels.csv", dtype=str)
    labels.sort_values("breed", kind="stable").to_csv(data / "labels.csv", index=False)
    out = tmp_path / "out"
    run_script(project, "train.py", "--dry-run", *CPU, f"--data-dir={data}", f"--out-dir={out}")
    for k in (0, 1):
        oof = pd.read_csv(out / f"oof_fold{k}.csv")
        # 2 batches of 16 of the fold's 120 rows (12 of each of 10 classes): its first 32 held 3 classes
        assert len(oof) == 32 and oof["target"].nunique() >= 6, oof["target"].value_counts()


def test_a_dry_run_after_training_touches_nothing_the_run_made(project, digits_dir):
    """Issue 47: both READMEs list the dry run first under "Use"; run in that order on a trained
    project it overwrote model_fold0.pth and model_fold1.pth with 1-epoch models and moved the
    good submission.csv aside, and predict.py then ensembled the dry run's folds. The dry run now
    has a folder of its own."""
    run_script(project, "train.py", *CPU, "--epochs", "1", "--folds", "2")
    run_script(project, "predict.py", *CPU)
    out = project / "output"
    kept = [p for p in out.iterdir() if p.suffix == ".pth" or p.name.startswith("oof") or p.name == "submission.csv"]
    before = {p.name: p.read_bytes() for p in kept}
    assert {"model_fold0.pth", "model_fold1.pth", "submission.csv"} <= set(before)
    log = run_script(project, "train.py", *CPU, "--dry-run").stdout
    assert {p.name: p.read_bytes() for p in kept} == before
    assert sorted(p.name for p in out.glob("submission*")) == ["submission.csv"]  # nothing moved aside
    assert "moved to" not in log and (out / "dry-run" / "model_fold0.pth").is_file()
    pred = run_script(project, "predict.py", *CPU).stdout
    assert "ENSEMBLE: 2 checkpoint(s), folds [0, 1]" in pred and "dry-run" not in pred
    assert "WARNING: dry-run checkpoints" not in pred


def test_a_tmpdir_too_long_for_a_socket_still_trains_with_loader_workers(project, tmp_path):
    """A DataLoader worker hands its batches over through a socket in TMPDIR/pymp-XXXXXXXX (torch's
    file_descriptor sharing), and Linux's AF_UNIX paths hold 107 bytes: under a TMPDIR of 76 bytes or
    more the worker's bind failed in a background thread and train.py waited forever for its first
    batch, SIGTERM too (a pytest tmp_path as TMPDIR did it, and a budget's kill then handed in the
    fallback). loader_sockets.socket_dir makes multiprocessing's folder in /tmp there, as CPython 3.14
    does itself; TMPDIR stays the run's for everything else."""
    long = tmp_path / ("t" * max(1, 80 - len(str(tmp_path))))
    long.mkdir()
    assert len(str(long)) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") > 107
    args = ["train.py", "--dry-run", "--device", "cpu", "--workers", "1", "--out-dir", str(tmp_path / "out")]
    log = run_script(project, *args, env={**RUN_ENV, "TMPDIR": str(long)}, timeout=180).stdout
    assert "DataLoader: num_workers=1," in log and "FOLD 1 DONE" in log, log[-2000:]
    assert not list(long.glob("pymp-*"))  # the sockets were bound elsewhere
    assert (tmp_path / "out" / "model_fold1.pth").is_file()
    # ...in a folder that goes with the script, through errors.end_now's os._exit too, which skips the
    # interpreter's exit (train.py's DONE, predict.py's SUBMISSION: each left one in /tmp)
    code = "from machinery import errors, loader_sockets; print(loader_sockets.socket_dir()); errors.end_now()"
    folder = Path(run_script(project, "-c", code, env={**RUN_ENV, "TMPDIR": str(long)}).stdout.strip())
    assert folder.name.startswith("pymp-") and folder.parent != long and not folder.exists(), folder


def test_loader_workers_share_one_socket_folder_and_a_killed_script_s_is_removed_by_the_next(project, tmp_path):
    """Each DataLoader worker made its own multiprocessing folder (TMPDIR/pymp-XXXXXXXX) and removed
    it at its exit, which a SIGKILL skips: a killed train.py with 2 workers left 2, ~10 a suite, 80 a
    day in /tmp. Now train.py makes one before its workers fork, named for its pid, and the next
    script that makes one (under run.py, predict.py) removes the folder of a process that is gone."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="kt", dir="/tmp"))  # short: a socket's path fits under it
    try:
        env, out = {**RUN_ENV, "TMPDIR": str(tmp)}, str(tmp_path / "out")
        cmd = ["train.py", *CPU, "--workers", "2", "--epochs", "4", "--out-dir", out]
        fold1 = False

        def in_fold1(line: str) -> bool:  # fold 0 saved, then an epoch of fold 1: its workers are running
            nonlocal fold1
            fold1 = fold1 or line.startswith("FOLD 1 (")
            return fold1 and line.startswith("Epoch ")

        proc, seen = start_until(project, cmd, in_fold1, env=env)
        made = sorted(p.name for p in tmp.glob("pymp-*"))
        assert made and all(n.startswith(f"pymp-k{proc.pid}-") for n in made) and len(made) == 1, (made, seen)
        os.kill(proc.pid, signal.SIGKILL)  # no exit runs: the folder stays
        proc.communicate(timeout=60)
        assert sorted(p.name for p in tmp.glob("pymp-*")) == made
        pred = run_script(project, "predict.py", *CPU, "--workers", "1", "--out-dir", out, env=env).stdout
        assert "SUBMISSION:" in pred and not list(tmp.glob("pymp-*"))  # the killed one's swept, its own removed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_json_log_says_who_set_the_batch(project):
    """batch_set_by, the VALIDATION line's key (kagtpl doctor reads it): your --batch-size is
    `user` with or without the probe (it read `rule` where no probe ran), the small-data shrink's
    batch `small-data`."""
    run_script(project, "train.py", *CPU, "--dry-run", "--batch-size", "16")
    records = [json.loads(x) for x in (project / "output" / "dry-run" / "train_log.jsonl").read_text().splitlines()]
    assert {r["batch_set_by"] for r in records} == {"user"} and records[0]["batch_size"] == 16
    run_script(project, "train.py", *CPU, "--dry-run", "--out-dir", "output/shrunk")
    records = [json.loads(x) for x in (project / "output" / "shrunk" / "train_log.jsonl").read_text().splitlines()]
    assert {r["batch_set_by"] for r in records} == {"small-data"}, records  # 160 rows: 32 -> 8


def test_early_stopping_waits_for_the_first_third_of_the_plan(project):
    """A flat val loss early in the schedule is the peak LR's noise, not overfitting. With --lr 0
    the weights stay (only BatchNorm's statistics move the val loss a little): with --patience 1
    over 9 epochs, a fold whose epoch 2 was no better stopped there before; now no fold stops
    before epoch 3, the first third of the plan."""
    out = ["--out-dir", "output/flat", "--folds", "2", "--epochs", "9", "--patience", "1", "--lr", "0"]
    log = run_script(project, "train.py", *CPU, *out).stdout
    stops = re.findall(r"^EARLY STOP: fold \d epoch (\d+), no better val loss for 1 epochs$", log, re.M)
    assert stops and min(int(e) for e in stops) >= 3, log[-3000:]
    folds = [re.findall(r"^Epoch \d+: Loss=[\d.]+, ValLoss=([\d.]+)", part, re.M) for part in log.split("FOLD ")[1:]]
    old_rule = [k for k, losses in enumerate(f for f in folds if f) if float(losses[1]) >= float(losses[0])]
    assert old_rule, "no fold's epoch 2 was worse than its epoch 1: this run cannot tell the rules apart"


def test_killed_after_fold_0_predict_uses_fold_0_and_skips_a_corrupt_checkpoint(project, digits_dir):
    proc, seen = start_until(project, ["train.py", *CPU, "--epochs", "2"], "FOLD 1 (")
    os.killpg(proc.pid, signal.SIGKILL)  # the container's time limit, mid-run
    proc.wait(timeout=60)
    assert any(x.startswith("FOLD 0 DONE") for x in seen), "".join(seen)
    out = project / "output"
    assert sorted(p.name for p in out.glob("model_fold*.pth")) == ["model_fold0.pth"]
    # the experiments table has the killed run's row, written when it started
    table = run_script(project, "-m", "machinery.experiments").stdout.splitlines()
    assert len(table) == 2 and table[1].endswith("killed (ended without a result)"), table

    pred = run_script(project, "predict.py", *CPU).stdout
    assert "ENSEMBLE: 1 checkpoint(s), folds [0]: model_fold0.pth" in pred
    assert_valid_submission(project, digits_dir)

    # a half-written or tampered checkpoint is skipped with a warning, the good one still used
    (out / "model_fold1.pth").write_bytes((out / "model_fold0.pth").read_bytes()[:5000])
    pred = run_script(project, "predict.py", *CPU).stdout
    assert "WARNING: skipping output/model_fold1.pth: cannot load" in pred
    assert "ENSEMBLE: 1 checkpoint(s), folds [0]" in pred

    # resume: fold 0 is complete and skipped; fold 1's corrupt file is retrained over
    log = run_script(project, "train.py", *CPU, "--epochs", "2").stdout  # the killed run's flags: resumed
    assert "FOLD 0: model_fold0.pth is complete, skipping (resume)" in log
    assert "FOLD 1 DONE" in log and "FOLD 2 DONE" in log
    assert "FOLD 0 DONE" not in log

    # a new run with another split leaves fold 2 of the 3-fold run behind: it is not ensembled
    run_script(project, "train.py", *CPU, "--epochs", "1", "--folds", "2")
    pred = run_script(project, "predict.py", *CPU).stdout
    assert "ENSEMBLE: 2 checkpoint(s), folds [0, 1]" in pred
    assert (
        "WARNING: skipping output/model_fold2.pth: trained with another configuration than the newest checkpoint "
        "(epochs=2, newest 1; folds=3, newest 2)" in pred
    )
    assert_valid_submission(project, digits_dir)


def test_predict_without_checkpoints_fails_clearly(project):
    r = run_script(project, "predict.py", *CPU, check=False)
    assert r.returncode != 0 and "no loadable model_fold*.pth" in r.stderr
    assert not (project / "output" / "submission.csv").exists()


def _copy_data(digits_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(digits_dir, data)
    return data


@pytest.mark.parametrize(
    "breakage,message",
    [
        ("bad_label", r"labels\.csv line 4 \(id \w+\): label 'wolf' is not a class of sample_submission\.csv"),
        ("missing_image", r"train/\w+\.jpg: image not found \(labels\.csv line 6\)"),
        ("corrupt_image", r"train/\w+\.jpg: missing or cannot be decoded as an image \(labels\.csv line 2\)"),
        ("empty_labels", r"labels\.csv: no rows"),
        ("no_label_column", r"labels\.csv: no column 'breed'"),
    ],
)
def test_preflight_names_the_file_and_row_before_training(tmp_path, digits_dir, breakage, message):
    data = _copy_data(digits_dir, tmp_path)
    labels = pd.read_csv(data / "labels.csv", dtype=str)
    if breakage == "bad_label":
        labels.loc[2, "breed"] = "wolf"
    elif breakage == "missing_image":
        (data / "train" / f"{labels.loc[4, 'id']}.jpg").unlink()
    elif breakage == "corrupt_image":
        (data / "train" / f"{labels.loc[0, 'id']}.jpg").write_bytes(b"\xff\xd8 truncated")
    elif breakage == "empty_labels":
        labels = labels.iloc[:0]
    elif breakage == "no_label_column":
        labels = labels.rename(columns={"breed": "dog"})
    labels.to_csv(data / "labels.csv", index=False)
    project = render(tmp_path / "proj", data_dir=str(data))
    r = run_script(project, "train.py", *CPU, "--dry-run", check=False)
    assert r.returncode == 1
    assert re.search("PREFLIGHT ERROR: .*" + message, r.stderr), r.stderr
    assert "Epoch" not in r.stdout and not list((project / "output").rglob("model_fold*.pth"))


@pytest.mark.parametrize("dry", [[], ["--dry-run"]], ids=["run", "dry-run"])
def test_pretrained_offline_fails_fast_with_the_way_out(project, dry):
    """The dry run fails exactly where the run would (it once went on from random weights with a
    WARNING, and the run then stopped with an ERROR: a smoke test passing where the run fails)."""
    t0 = time.time()
    r = run_script(project, "train.py", *CPU, "--pretrained", *dry, check=False)
    assert r.returncode == 1 and time.time() - t0 < 40
    assert "--weights" in r.stderr and "--no-pretrained" in r.stderr and "unreachable" in r.stderr
    assert "Epoch" not in r.stdout and not list((project / "output").rglob("model_fold*.pth"))


def test_local_weights_file_is_loaded(project, tmp_path):
    import timm

    source = timm.create_model("resnet18", pretrained=False, num_classes=1000)
    with torch.no_grad():
        source.conv1.weight.fill_(0.0123)
    weights = tmp_path / "resnet18_imagenet.pth"
    torch.save(source.state_dict(), weights)
    run_script(project, "train.py", *CPU, "--dry-run", "--model", "resnet18", "--weights", str(weights), "--lr", "0")
    ckpt = torch.load(project / "output" / "dry-run" / "model_fold0.pth", weights_only=True)
    assert torch.allclose(ckpt["model"]["conv1.weight"], torch.full_like(ckpt["model"]["conv1.weight"], 0.0123))
    assert ckpt["model"]["fc.weight"].shape[0] == 10  # ImageNet head replaced by the competition's


def test_generated_projects_own_tests_pass(project):
    # through the fork server, as test_render.py runs the other tasks' tests: pytest and torch imported once
    r = run_script(project, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", check=False, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\d+ passed", r.stdout)


def test_label_column_submission(tmp_path, digits_dir):
    """The generic layout: train.csv with id,label and a sample submission with one label column."""
    data = _copy_data(digits_dir, tmp_path)
    (data / "labels.csv").rename(data / "train.csv")
    sample = pd.read_csv(data / "sample_submission.csv", dtype={"id": str})[["id"]].assign(breed="zero")
    sample.to_csv(data / "sample_submission.csv", index=False)
    project = render(tmp_path / "proj", data_dir=str(data), labels_csv="train.csv")
    run_script(project, "train.py", *CPU, "--dry-run")
    run_script(project, "predict.py", *CPU, "--out-dir", "output/dry-run")
    sub = pd.read_csv(project / "output" / "dry-run" / "submission.csv", dtype={"id": str})
    assert list(sub.columns) == ["id", "breed"] and list(sub["id"]) == list(sample["id"])
    assert set(sub["breed"]) <= {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}


def test_on_a_real_terminal_the_progress_line_is_redrawn_in_place_and_kept_out_of_train_log(project):
    """train.py with its stdout on a pseudo-terminal (pty), as a person at a console runs it:
    inside each epoch one line is redrawn in place (`\\r` + erase line), and cleared before the
    Epoch line; output/train.log, the log of the same run, holds none of it (and no PROGRESS:
    line either: an epoch here takes seconds, under the 30 s a log waits)."""
    import pty

    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "train.py", *CPU, "--epochs", "2", "--folds", "2"],
        cwd=project,
        env=RUN_ENV,
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child side is closed, the run has ended
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(timeout=60) == 0, seen[-3000:]
    screen = seen.decode()
    drawn = re.findall(r"\r\x1b\[Kfold (\d) epoch (\d) step (\d+)/(\d+), \d+ samples/s, ETA \S+, loss [\d.]+", screen)
    assert {(f, e) for f, e, _, _ in drawn} >= {("0", "1")}, screen[-3000:]  # the first epoch, at least
    assert all(int(i) <= int(n) for _, _, i, n in drawn)
    assert "\r\x1b[KEpoch 1: " in screen, screen[-3000:]  # the progress line cleared, the Epoch line in its place
    log = (project / "output" / "train.log").read_text()
    assert "Epoch 1: " in log and "\x1b" not in log and "\r" not in log and "PROGRESS:" not in log
