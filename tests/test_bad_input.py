"""Hostile input, case by case: every bad command line, bad file and fault ends in one clear
line naming the file and row where there is one, loses nothing, and leaves a submission
wherever one could be made.

The case lists below are the inventory docs/bad-input.md counts (test_the_docs_count_these_cases
holds the two together). Generated scripts run as subprocesses on small real data on CPU;
kagtpl runs as `python -m kagtpl`. Fast tier: the kagtpl and flag cases. Slow tier: the rest.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import (
    ROOT,
    RUN_ENV,
    dry_run_into_output,
    forkpython,
    import_project,
    predict_streamed,
    render,
    run_script,
    start_until,
)
from kagtpl import demo, table

CASES: Counter = Counter()  # category -> cases tried by the single tests below (the lists count themselves)


def case(category: str):
    """Count a single-case test in a category of docs/bad-input.md's table."""

    def register(test):
        CASES[category] += 1
        return test

    return register


# ----------------------------------------------------------------------------- kagtpl's command line


def kagtpl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kagtpl", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def snapshot(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _not_a_competition(t: Path) -> str:
    data = t / "not-a-comp"
    data.mkdir()
    (data / "notes.txt").write_text("hello")
    return str(data)


def _a_file(t: Path) -> str:
    (t / "afile").write_text("mine")
    return str(t / "afile")


def _conflicted_project(t: Path) -> str:
    project = render(t / "proj")
    text = (project / "machinery" / "engine.py").read_text()
    (project / "machinery" / "engine.py").write_text("<<<<<<< before updating\n" + text + ">>>>>>> after updating\n")
    return str(project)


def _digits(t: Path) -> str:
    return str(demo.write_digits(t / "digits", n_train=20, n_test=5))


def _dicom_scans(t: Path) -> str:
    """VinBigData's layout: train/ and test/ of DICOM scans, the boxes in train.csv."""
    data = t / "vinbig"
    for name in ("train", "test"):
        (data / name).mkdir(parents=True)
        for k in range(3):
            (data / name / f"scan{k}.dcm").write_bytes(b"DICM")
    (data / "train.csv").write_text("image_id,class_name,x_min,y_min,x_max,y_max\nscan0,Nodule,1,2,3,4\n")
    (data / "sample_submission.csv").write_text("image_id,PredictionString\nscan0,14 1 0 0 1 1\n")
    return str(data)


def _table(t: Path) -> str:
    return str(table.write_table(t / "table", "binary"))


def _two_targets(t: Path) -> str:
    """A table with two target columns in its sample (EC1 and EC2, as Playground S3E18): with
    --target EC1, kagtpl rendered a project that read EC2 as a feature, missing from test.csv."""
    data = table.write_table(t / "ec", "binary")
    for name in ("train.csv", "sample_submission.csv"):
        rewrite_csv(data / name, lambda df: df.insert(len(df.columns), "EC2", "0"))
    return str(data)


# (arguments given the test's folder, the message's words). Security cases are marked: they try
# to write outside the destination.
CLI_CASES = [
    (lambda t: ["new", "p", "--task", "speech", "--gpu", "t4"], "unknown task 'speech'; valid tasks: image, tabular"),
    (
        lambda t: ["new", "p", "--task", "tabular", "--gpu", "t4", "--data", _not_a_competition(t)],
        "does not look like a table competition",
    ),
    (
        lambda t: ["new", "p", "--task", "tabular", "--gpu", "t4", "--image-size", "224"],
        "--image-size is for image, segmentation and detection competitions",
    ),
    (lambda t: ["table", str(t / "x"), "--kind", "graph"], "unknown kind 'graph'; valid kinds: binary"),
    (lambda t: ["new", "p", "--task", "image", "--gpu", "tpu"], "unknown GPU 'tpu'; valid GPUs: t4, t4x2"),
    (lambda t: ["new", "", "--task", "image", "--gpu", "t4"], "invalid project name ''"),
    (
        lambda t: ["new", "p", "--task", "image", "--gpu", "t4", "--data", _not_a_competition(t)],
        "does not look like an image competition",
    ),
    (lambda t: ["new", "p", "--task", "image", "--gpu", "t4", "--data", str(t / "missing")], "no such folder"),
    (lambda t: ["new", "p", "--task", "image", "--gpu", "t4", "--folds", "1"], "--folds 1: must be between 2 and 20"),
    (lambda t: ["recommend", "--gpu", "tpu"], "unknown GPU 'tpu'"),
    (lambda t: ["new", "p", "--task", "image", "--gpu", "t4", "--budget", "nine hours"], "--budget: cannot read"),
    (lambda t: ["recommend", "--gpu", "a10", "--budget", "soon"], "--budget: cannot read budget 'soon'"),
    (lambda t: ["new", "a" * 300, "--task", "image", "--gpu", "cpu"], "project name of 300 characters: at most 100"),
    (lambda t: ["new", "p", "--task", "image", "--gpu", "cpu", "--dest", _a_file(t)], "is a file, not a folder"),
    (lambda t: ["new", "p", "--task", "image", "--gpu", "cpu", "--dest", "/proc/kagtpl/x"], "cannot write"),
    (lambda t: ["table", _a_file(t)], "exists and is not a folder"),
    (lambda t: ["demo", _a_file(t)], "exists and is not a folder"),
    (lambda t: ["new", "p", "--folds", "abc"], "Invalid value for '--folds'"),
    (lambda t: ["new"], "Missing argument 'NAME'"),
    (lambda t: ["recommend", "--bogus"], "No such option: --bogus"),
    (lambda t: ["recommend", "--image-size", "0"], "--image-size 0: must be between 16 and 2048"),
    (
        lambda t: ["new", "p", "--task", "image", "--gpu", "cpu", "--batch-size", "100000000"],
        "--batch-size 100000000: must be between 0 and 65536",
    ),
    (
        lambda t: ["new", "p", "--task", "image", "--gpu", "cpu", "--dest", str(t / "a/b/c"), "--data", str(t / "no")],
        "no such folder",
    ),
    (lambda t: ["doctor", str(t / "missing.log")], "no such log file"),
    (
        lambda t: ["new", "p", "--task", "tabular", "--gpu", "t4", "--submission", "label"],
        "--submission is for image competitions; tables and text write labels with --metric accuracy",
    ),
    (
        lambda t: ["new", "p", "--task", "image", "--gpu", "t4", "--submission", "prob"],
        "--submission 'prob': one of auto, probs, label, positive",
    ),
    (
        lambda t: ["new", "p", "--task", "tabular", "--gpu", "t4", "--data", _two_targets(t), "--target", "target"],
        "sample_submission.csv: 2 target columns (target, EC2): a table project learns one target column; several",
    ),
    (
        lambda t: ["new", "p", "--task", "tabular", "--gpu", "t4", "--data", _table(t), "--target", "target,site"],
        "--target target,site: a table project learns one target column; several (multi-label, multi-target) are",
    ),
    (  # it said "no training image folder" beside train/ itself
        lambda t: ["new", "p", "--task", "detection", "--gpu", "t4", "--data", _dicom_scans(t)],
        "; train/ holds 3 .dcm file(s), no image (.jpg .jpeg .png .bmp .tif .tiff .webp): DICOM is not read; convert",
    ),
    (  # a probability column per class (the digits' ten): one column of the second's cannot hold them
        lambda t: ["new", "p", "--task", "image", "--gpu", "t4", "--data", _digits(t), "--submission", "positive"],
        "--submission positive writes one probability column after the id; ",
    ),
    (  # the digits' sample holds a probability per class: accuracy scores labels (an image's --metric was dropped)
        lambda t: ["new", "p", "--task", "image", "--gpu", "t4", "--data", _digits(t), "--metric", "accuracy"],
        "--metric accuracy does not score a probs submission (a probability column per class); use logloss or auc",
    ),
]
SECURITY_CLI_CASES = [
    (lambda t: ["new", "../evil", "--task", "image", "--gpu", "t4"], "invalid project name '../evil'"),
    (lambda t: ["new", "a/b", "--task", "image", "--gpu", "t4"], "invalid project name 'a/b'"),
    (lambda t: ["new", "/tmp/evil", "--task", "image", "--gpu", "t4"], "invalid project name '/tmp/evil'"),
]


@pytest.mark.parametrize(
    "args,message", CLI_CASES + SECURITY_CLI_CASES, ids=lambda v: v[:40] if isinstance(v, str) else ""
)
def test_kagtpl_bad_input_is_one_red_line_exit_1_and_nothing_written(tmp_path, args, message):
    argv = args(tmp_path)
    before = snapshot(tmp_path)
    r = kagtpl(*argv, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert snapshot(tmp_path) == before  # not even the empty parents of a --dest


@case("kagtpl command line")
def test_kagtpl_check_names_unresolved_conflicts(tmp_path):
    project = _conflicted_project(tmp_path)
    r = kagtpl("check", project, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == (
        "error: unresolved update conflicts in machinery/engine.py: "
        "resolve the <<<<<<< / >>>>>>> blocks (and *.rej) first"
    )


@case("kagtpl command line")
def test_kagtpl_new_sweeps_the_staging_folder_of_a_killed_render(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".p.{dead.stdout.strip()}.abc123" / "p"
    left.mkdir(parents=True)
    (left / "train.py").write_text("half")
    r = kagtpl("new", "p", "--task", "image", "--gpu", "cpu", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert snapshot(tmp_path)[0] == "p" and not list(tmp_path.glob(".p.*"))


@case("kagtpl command line")
def test_a_failed_render_removes_the_parents_it_made_and_keeps_anyone_elses(tmp_path):
    from kagtpl import paths

    made = paths.made_parents(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a" / "b" / "c", tmp_path / "a" / "b", tmp_path / "a"]
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    paths.remove_empty(made)
    assert not (tmp_path / "a").exists()
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "mine.txt").write_text("someone else's")  # written meanwhile: a stays
    paths.remove_empty(made)
    assert snapshot(tmp_path) == ["a", "a/mine.txt"]


@case("kagtpl command line")
def test_help_names_values_and_tables_fit_the_terminal(tmp_path):
    env = {**os.environ, "COLUMNS": "90"}
    run = [sys.executable, "-m", "kagtpl"]
    help_text = subprocess.run([*run, "new", "--help"], env=env, capture_output=True, text=True).stdout
    assert "--folds FOLDS" in help_text and "--data DIR" in help_text and "<int>" not in help_text
    for command in (["gpus"], ["recommend", "--gpu", "a10"]):
        out = subprocess.run([*run, *command], env=env, capture_output=True, text=True).stdout
        assert max(len(line) for line in out.splitlines()) <= 90, out


# ----------------------------------------------------------------------------- generated scripts: flags

# (train.py flags, words of the one ERROR line). Checked before anything is read or trained.
FLAG_CASES = [
    (["--accum-steps", "-1"], "--accum-steps -1: must be from 0 to 4096"),
    (["--folds", "1"], "--folds 1: must be from 2 to 100"),
    (["--epochs", "0"], "--epochs 0: must be from 1 to 100000"),
    (["--batch-size", "-5"], "--batch-size -5: must be from 0 to 65536"),
    (["--image-size", "0"], "--image-size 0: must be from 16 to 4096"),
    (["--workers", "-2"], "--workers -2: must be from -1 to 64"),
    (["--lr=-0.001"], "--lr -0.001: must be from 0.0 to 10.0"),
    (["--lr", "nan"], "--lr nan: must be from 0.0 to 10.0"),
    (["--weight-decay", "-1"], "--weight-decay -1.0: must be from 0.0 to 10.0"),
    (["--patience", "0"], "--patience 0: must be from 1 to 100000"),
    (["--seed", "-3"], "--seed -3: must be from 0 to 4294967295"),
    (["--budget=-5m"], "--budget: cannot read budget '-5m'"),
    (["--folds", "three"], "argument --folds: invalid int value: 'three' (python train.py --help)"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--model", "resnet_eighteen"], "--model 'resnet_eighteen' is not a timm model"),
]
TABULAR_FLAG_CASES = [
    (["--accum-steps", "5000"], "--accum-steps 5000: must be from 0 to 4096"),
    (["--dropout", "1.5"], "--dropout 1.5: must be from 0.0 to 0.95"),
    (["--hidden", "512,abc"], "--hidden '512,abc': give layer widths like 512,256"),
    (["--drop", "no_such_column"], "--drop no_such_column: not a feature column"),
]
PREDICT_FLAG_CASES = [
    (["--batch-size", "-1"], "--batch-size -1: must be from 0 to 65536"),
    (["--workers", "99"], "--workers 99: must be from -1 to 64"),
]


@pytest.fixture(scope="module")
def image_project(tmp_path_factory, digits_dir):
    return render(tmp_path_factory.mktemp("bad") / "img", data_dir=str(digits_dir))


@pytest.fixture(scope="module")
def table_data(tmp_path_factory):
    return table.write_table(tmp_path_factory.mktemp("tab") / "data", "binary")


@pytest.fixture(scope="module")
def tabular_project(tmp_path_factory, table_data):
    answers = {"task": "tabular", "id_col": "row_id", "target": "target", "problem": "binary", "metric": "auc"}
    return render(tmp_path_factory.mktemp("bad") / "tab", data_dir=str(table_data), submission="probs", **answers)


LIBJPEG = ("Premature end of JPEG file", "Corrupt JPEG data")


def one_error(r: subprocess.CompletedProcess, prefix: str, words: str) -> None:
    """Exit 1 and one line of ours on stderr: PREFIX: ... words ... (no traceback). libjpeg may
    have printed its own line first ("Premature end of JPEG file"): C code writes to fd 2."""
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith(LIBJPEG)]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert lines[0].startswith(prefix + ": ") and words in lines[0], lines[0]


def train(project: Path, out: Path, *args: str, data: Path | None = None) -> subprocess.CompletedProcess:
    data_flag = [f"--data-dir={data}"] if data else []
    return run_script(
        project, "train.py", "--dry-run", "--device", "cpu", f"--out-dir={out}", *data_flag, *args, check=False
    )


def no_checkpoints(out: Path) -> bool:
    return not list(out.glob("model_fold*.pth")) if out.exists() else True


@pytest.mark.slow
@pytest.mark.parametrize("flags,words", FLAG_CASES, ids=[" ".join(f) for f, _ in FLAG_CASES])
def test_train_flag_out_of_range_is_one_error_line(image_project, tmp_path, flags, words):
    r = train(image_project, tmp_path / "out", *flags)
    one_error(r, "ERROR", words)
    assert no_checkpoints(tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("flags,words", TABULAR_FLAG_CASES, ids=[" ".join(f) for f, _ in TABULAR_FLAG_CASES])
def test_tabular_flag_out_of_range_is_one_error_line(tabular_project, tmp_path, flags, words):
    r = train(tabular_project, tmp_path / "out", *flags)
    prefix = "PREFLIGHT ERROR" if flags[0] == "--drop" else "ERROR"
    one_error(r, prefix, words)
    assert no_checkpoints(tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("flags,words", PREDICT_FLAG_CASES, ids=[" ".join(f) for f, _ in PREDICT_FLAG_CASES])
def test_predict_flag_out_of_range_is_one_error_line(image_project, tmp_path, flags, words):
    r = run_script(image_project, "predict.py", f"--out-dir={tmp_path}", *flags, check=False)
    one_error(r, "ERROR", words)


# ----------------------------------------------------------------------------- bad data


def rewrite_csv(path: Path, fn) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    fn(df)
    df.to_csv(path, index=False)


def drop_rows(path: Path, rows) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df.drop(index=rows(df)).to_csv(path, index=False)


def first_test_image(data: Path) -> Path:
    sample = pd.read_csv(data / "sample_submission.csv", dtype=str)
    return data / "test" / f"{sample['id'][0]}.jpg"


def first_train_image(data: Path) -> Path:
    labels = pd.read_csv(data / "labels.csv", dtype=str)
    return data / "train" / f"{labels['id'][0]}.jpg"


def _append_line(path: Path, line: bytes) -> None:
    with open(path, "ab") as f:
        f.write(line)


# (how to spoil a copy of the digits data, train.py flags, the words of the PREFLIGHT ERROR line)
IMAGE_DATA_CASES = {
    "every test image missing (a wrong --test-dir)": (
        lambda d: [p.unlink() for p in (d / "test").iterdir()],
        [],
        "image not found (sample_submission.csv line 2)",
    ),
    "corrupt train image": (
        lambda d: first_train_image(d).write_bytes(b"\xff\xd8garbage"),
        [],
        "cannot be decoded as an image (labels.csv line 2)",
    ),
    "duplicate id in sample_submission": (
        lambda d: rewrite_csv(d / "sample_submission.csv", lambda df: df.loc.__setitem__((1, "id"), df["id"][0])),
        [],
        "sample_submission.csv line 3: duplicate id",
    ),
    "duplicate id in labels.csv": (
        lambda d: rewrite_csv(d / "labels.csv", lambda df: df.loc.__setitem__((4, "id"), df["id"][0])),
        [],
        "labels.csv line 6: duplicate id",
    ),
    "label not a class": (
        lambda d: rewrite_csv(d / "labels.csv", lambda df: df.loc.__setitem__((2, "breed"), "eleven")),
        [],
        "labels.csv line 4 (id",
    ),
    "empty labels.csv (0 bytes)": (lambda d: (d / "labels.csv").write_bytes(b""), [], "the file is empty"),
    "header-only labels.csv": (lambda d: (d / "labels.csv").write_text("id,breed\n"), [], "labels.csv: no rows"),
    "labels.csv not UTF-8": (
        lambda d: _append_line(d / "labels.csv", b"caf\xe9,one\n"),
        [],
        "line 242: not UTF-8 text",
    ),
    "ragged row in labels.csv": (
        lambda d: _append_line(d / "labels.csv", b"x1,one,extra\n"),
        [],
        "labels.csv line 242: 3 fields, the header has 2",
    ),
    "fewer images of a class than folds": (
        lambda d: drop_rows(d / "labels.csv", lambda df: df.index[df["breed"] == "one"][1:]),
        [],
        "class 'one' has 1 row(s), fewer than --folds 2",
    ),
}
SECURITY_DATA_CASES = {
    "id with ../ in labels.csv": (
        lambda d: rewrite_csv(d / "labels.csv", lambda df: df.loc.__setitem__((0, "id"), "../../../etc/passwd")),
        [],
        "labels.csv line 2: id '../../../etc/passwd' points outside",
    ),
    "absolute id in sample_submission": (
        lambda d: rewrite_csv(d / "sample_submission.csv", lambda df: df.loc.__setitem__((0, "id"), "/etc/hostname")),
        [],
        "sample_submission.csv line 2: id '/etc/hostname' points outside",
    ),
}


def spoiled(digits_dir: Path, tmp_path: Path, spoil) -> Path:
    data = tmp_path / "data"
    shutil.copytree(digits_dir, data)
    spoil(data)
    return data


@pytest.mark.slow
@pytest.mark.parametrize("case", list(IMAGE_DATA_CASES) + list(SECURITY_DATA_CASES))
def test_bad_image_data_stops_preflight_naming_file_and_line(image_project, digits_dir, tmp_path, case):
    spoil, flags, words = {**IMAGE_DATA_CASES, **SECURITY_DATA_CASES}[case]
    data = spoiled(digits_dir, tmp_path, spoil)
    r = train(image_project, tmp_path / "out", *flags, data=data)
    one_error(r, "PREFLIGHT ERROR", words)
    assert no_checkpoints(tmp_path / "out")
    assert "Epoch" not in r.stdout  # before training, not after


def set_cell(path: Path, row: int, col: str, value: str) -> None:
    rewrite_csv(path, lambda df: df.loc.__setitem__((row, col), value))


TABULAR_DATA_CASES = {
    "inf in test.csv": (
        lambda d: set_cell(d / "test.csv", 3, "mean_area", "inf"),
        [],
        "test.csv line 5, column 'mean_area'",
    ),
    "-inf in train.csv": (
        lambda d: set_cell(d / "train.csv", 0, "mean_radius", "-inf"),
        [],
        "train.csv line 2, column 'mean_radius': -inf is not a finite number",
    ),
    "overflow to inf in train.csv": (
        lambda d: set_cell(d / "train.csv", 6, "mean_texture", "1e999"),
        [],
        "train.csv line 8, column 'mean_texture': inf is not a finite number",
    ),
    "word in a numeric test column": (
        lambda d: set_cell(d / "test.csv", 1, "mean_area", "n/a?"),
        [],
        "test.csv line 3, column 'mean_area': 'n/a?' is not a finite number",
    ),
    "duplicate id in train.csv": (
        lambda d: rewrite_csv(d / "train.csv", lambda df: df.loc.__setitem__((3, "row_id"), df["row_id"][0])),
        [],
        "train.csv line 5: duplicate id",
    ),
    "duplicate id in sample_submission": (
        lambda d: rewrite_csv(
            d / "sample_submission.csv", lambda df: df.loc.__setitem__((2, "row_id"), df["row_id"][0])
        ),
        [],
        "sample_submission.csv line 4: duplicate id",
    ),
    "0-byte test.csv": (lambda d: (d / "test.csv").write_bytes(b""), [], "test.csv: the file is empty"),
    "header-only train.csv": (
        lambda d: (d / "train.csv").write_text((d / "train.csv").read_text().splitlines()[0] + "\n"),
        [],
        "train.csv: no rows (only a header)",
    ),
    "ragged row in train.csv": (
        lambda d: _append_line(d / "train.csv", b"r1,1,2\n" + b"1," * 40 + b"\n"),
        [],
        "fields, the header has",
    ),
    "test.csv not UTF-8": (lambda d: _append_line(d / "test.csv", b"r\xe9\xe9,1\n"), [], "not UTF-8 text"),
    "word in a regression target": (
        lambda d: set_cell(d / "train.csv", 9, "target", "lots"),
        ["--problem", "regression", "--metric", "rmse"],
        "train.csv line 11, column 'target': 'lots' is not a finite number",
    ),
    "empty target": (
        lambda d: set_cell(d / "train.csv", 4, "target", ""),
        [],
        "train.csv line 6: target 'target' is empty",
    ),
    "a date column with a day that is no date in test.csv": (
        lambda d: (_add_dates(d), set_cell(d / "test.csv", 2, "visit", "2024-02-30")),
        [],
        "test.csv line 4, column 'visit': '2024-02-30' is not a date",
    ),
    "--dates naming a column of numbers": (
        lambda d: None,
        ["--dates", "mean_radius"],
        "train.csv line 2, column 'mean_radius': 15.04 is not a date",
    ),
    "--dates naming no column": (lambda d: None, ["--dates", "visit"], "--dates visit: not a feature column of"),
}


def _add_dates(data: Path) -> None:
    """An ISO date column in train.csv and test.csv, as a shop's or a patient's visit."""
    for name in ("train.csv", "test.csv"):
        rewrite_csv(data / name, lambda df: df.insert(1, "visit", [f"2023-{1 + i % 12:02d}-15" for i in df.index]))


def test_class_folders_train_their_names_as_labels(project_modules, digits_dir, tmp_path):
    """--labels-csv '' reads train/<class>/<image> (Plant Seedlings): each image's label is its
    folder's name, its id <class>/<file>; hidden files are not images; no class folder is an error."""
    train = project_modules.train
    data = Path(shutil.copytree(digits_dir, tmp_path / "data"))
    labels = pd.read_csv(data / "labels.csv", dtype=str)
    for image_id, label in zip(labels["id"], labels["breed"], strict=True):
        (data / "train" / label).mkdir(exist_ok=True)
        (data / "train" / f"{image_id}.jpg").rename(data / "train" / label / f"{image_id}.jpg")
        (data / "train" / label / ".DS_Store").write_bytes(b"\0")
    (data / "labels.csv").unlink()
    args = train.get_args(["--data-dir", str(data), "--labels-csv", ""])
    rows, _, classes, _, kind = train.load_data(args)
    assert kind == "probs" and len(rows) == len(labels) and sorted(classes) == sorted(set(labels["breed"]))
    found = dict(zip(rows["id"], rows["breed"], strict=True))
    assert found == {f"{b}/{i}.jpg": b for i, b in zip(labels["id"], labels["breed"], strict=True)}
    assert all(Path(p).is_file() for p in rows["path"])
    # Dogs vs. Cats Redux: no class folder, each file named <class>.<n>.jpg
    for folder in sorted(p for p in (data / "train").iterdir() if p.is_dir()):
        for k, image in enumerate(sorted(folder.glob("*.jpg"))):
            image.rename(data / "train" / f"{folder.name}.{k}.jpg")
        shutil.rmtree(folder)
    rows, _, classes, _, _ = train.load_data(args)
    assert sorted(classes) == sorted(set(labels["breed"])) and len(rows) == len(labels)
    assert all(i.startswith(f"{b}.") for i, b in zip(rows["id"], rows["breed"], strict=True))
    assert sorted(rows["breed"]) == sorted(labels["breed"]) and all(Path(p).is_file() for p in rows["path"])
    with pytest.raises(project_modules.errors.DataError, match=r"no <class>/<image> or <class>\.<n> image"):
        train.load_data(train.get_args(["--data-dir", str(data), "--labels-csv", "", "--train-dir", "test"]))


def binary_digits(digits_dir: Path, dest: Path, placeholder) -> Path:
    """The digits as two classes (under 5, 5 and over) in one `label` column of train.csv, the
    sample's one column `label` holding `placeholder` (0.5: Dogs vs. Cats Redux; 0: Histopathologic)."""
    data = Path(shutil.copytree(digits_dir, dest))
    names = "zero one two three four five six seven eight nine".split()
    labels = pd.read_csv(data / "labels.csv", dtype=str)
    labels["label"] = [int(names.index(b) >= 5) for b in labels.pop("breed")]
    labels.to_csv(data / "train.csv", index=False)
    (data / "labels.csv").unlink()
    sample = pd.read_csv(data / "sample_submission.csv", dtype=str)
    pd.DataFrame({"id": sample["id"], "label": placeholder}).to_csv(data / "sample_submission.csv", index=False)
    return data


def test_a_binary_samples_one_column_of_probabilities_is_filled_with_one(project_modules, digits_dir, tmp_path, capsys):
    """Dogs vs. Cats Redux: train.csv `id,label` (0/1), the sample `id,label` with 0.5 in it: the
    project wrote hard 0/1 labels, which log loss scores at ~34.5 a wrong row. A fraction in the
    sample's one label column says probabilities: the second class's is written, the metric log
    loss; whole numbers stay labels, with a line naming --metric auc. --metric auc (Histopathologic,
    SIIM-ISIC) or logloss scores probabilities: the sample's 0s then hold the second class's too, scored
    by that metric; a metric that does not score what the submission holds is one error."""
    train = project_modules.train
    for placeholder, kind in ((0.5, "positive"), (0, "label")):
        data = binary_digits(digits_dir, tmp_path / f"data{placeholder}", placeholder)
        flags = ["--data-dir", str(data), "--labels-csv", "train.csv", "--label-col", "label"]
        rows, sample, classes, _, found = train.load_data(train.get_args(flags))
        metric = train.competition_metric(found)[0]
        assert (found, classes, metric) == (kind, ["0", "1"], "logloss" if placeholder else "Acc")
        said = "SUBMISSION: labels ['0', '1'] in 'label'; scored on probabilities (AUC, log loss): --metric auc or"
        assert (said in capsys.readouterr().out) == (kind == "label")
        assert train.load_data(train.get_args([*flags, "--submission", "positive"]))[4] == "positive"
        args = train.get_args([*flags, "--metric", "auc"])
        found = train.load_data(args)[4]
        assert (found, train.competition_metric(found, args.metric)) == ("positive", ("AUC", True))
        assert "SUBMISSION: labels" not in capsys.readouterr().out
        with pytest.raises(project_modules.errors.RunError, match=r"--metric accuracy does not score a positive"):
            train.load_data(train.get_args([*flags, "--metric", "accuracy", "--submission", "positive"]))
    labels = pd.read_csv(data / "train.csv", dtype=str)
    labels.loc[0, "label"] = "2"  # a third class: one probability column cannot hold it
    labels.to_csv(data / "train.csv", index=False)
    with pytest.raises(project_modules.errors.DataError, match=r"one probability column needs 2 classes"):
        train.load_data(train.get_args([*flags, "--submission", "positive"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "placeholder,answers", [(0.5, {}), (0, {"submission": "positive"}), (0, {"metric": "auc", "submission": "auto"})]
)
def test_a_binary_probability_submission_is_trained_predicted_and_served_as_one(
    digits_dir, tmp_path, placeholder, answers
):
    """The whole path of the 0.5 sample: train.py's fallback is the second class's share, predict.py
    writes probabilities in (0, 1), serve_defaults.json says so for serve.py (predict.served_kind).
    A sample of 0s (Histopathologic Cancer Detection, scored by AUC) says nothing: `kagtpl new
    --submission positive` renders the answer as train.py's default, so run.py and a Kaggle
    notebook, which pass no flag, write the probability too; `--metric auc` alone says it as well
    (the submission stays auto), and the folds are scored by AUC."""
    data = binary_digits(digits_dir, tmp_path / "data", placeholder)
    project = render(tmp_path / "dogs", data_dir=str(data), labels_csv="train.csv", label_col="label", **answers)
    log = dry_run_into_output(project, "--device", "cpu", "--no-pretrained").stdout
    scored = "AUC" if answers.get("metric") else "logloss"
    assert re.search(rf"^OOF: (\w+=[\d.]+, )*{scored}=[\d.]+ over \d+ rows", log, re.M), log[-3000:]
    out = project / "output"
    defaults = json.loads((out / "serve_defaults.json").read_text())
    share = float(pd.read_csv(data / "train.csv")["label"].mean())
    assert defaults["kind"] == "probability" and defaults["values"]["label"] == pytest.approx(share), defaults
    run_script(project, "predict.py", "--device", "cpu")
    sub = pd.read_csv(out / "submission.csv")
    assert list(sub.columns) == ["id", "label"] and sub["label"].between(0, 1).all() and (sub["label"] % 1 != 0).all()
    predict = import_project(project, ("predict",)).predict
    assert predict.served_kind(out, {"label_col": "label"}, ["id", "label"]) == "positive"
    defaults.pop("kind")  # an older run's serve_defaults.json: the kind from the config's flags
    (out / "serve_defaults.json").write_text(json.dumps(defaults))
    config = {"label_col": "label", **answers}
    assert predict.served_kind(out, config, ["id", "label"]) == ("positive" if answers else "label")


def test_one_hot_labels_train_as_one_label_and_a_row_without_one_1_names_its_line(
    project_modules, digits_dir, tmp_path
):
    """--label-col '' reads a 0/1 column per class of the sample (Plant Pathology) as each row's
    class; a row with two 1s (multi-label) or none stops the preflight naming its line."""
    train = project_modules.train
    data = Path(shutil.copytree(digits_dir, tmp_path / "data"))
    labels = pd.read_csv(data / "labels.csv", dtype=str)
    classes = list(pd.read_csv(data / "sample_submission.csv", nrows=0).columns[1:])
    hot = pd.DataFrame({"id": labels["id"], **{c: (labels["breed"] == c).astype(int) for c in classes}})
    hot.to_csv(data / "labels.csv", index=False)
    args = train.get_args(["--data-dir", str(data), "--label-col", ""])
    rows, _, found, _, probs = train.load_data(args)
    assert found == classes and probs and args.label_col == ""
    assert [classes[k] for k in rows["target"]] == list(labels["breed"])
    for line in ("1", "0"):  # two 1s in row 3 (line 4), then none
        spoiled = hot.copy()
        spoiled.loc[2, classes] = [1 if line == "1" and k < 2 else 0 for k in range(len(classes))]
        spoiled.to_csv(data / "labels.csv", index=False)
        with pytest.raises(
            project_modules.errors.DataError, match=r"labels.csv line 4 \(id \w+\): .*one-hot needs one 1"
        ):
            train.load_data(args)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TABULAR_DATA_CASES))
def test_bad_table_stops_preflight_naming_column_and_line(tabular_project, table_data, tmp_path, case):
    spoil, flags, words = TABULAR_DATA_CASES[case]
    data = spoiled(table_data, tmp_path, spoil)
    r = train(tabular_project, tmp_path / "out", *flags, data=data)
    one_error(r, "PREFLIGHT ERROR", words)
    assert no_checkpoints(tmp_path / "out")


@pytest.mark.slow
@case("bad data")
def test_what_passes_preflight_gives_a_finite_submission(tabular_project, table_data, tmp_path):
    """Extreme finite values, an id-like text column, a numeric column with a typo: the run goes
    on, says what it did with each, and writes a checked, finite submission."""

    def spoil(d: Path) -> None:
        set_cell(d / "test.csv", 0, "mean_area", "1e300")
        set_cell(d / "train.csv", 1, "mean_perimeter", "-1e200")
        for name in ("train.csv", "test.csv"):
            rewrite_csv(d / name, lambda df: df.insert(1, "Name", [f"Passenger {i}" for i in range(len(df))]))
        set_cell(d / "train.csv", 2, "grade", "3")  # a number in a category column: fine
        rewrite_csv(d / "train.csv", lambda df: df.insert(2, "fare", [str(i % 50) for i in range(len(df))]))
        rewrite_csv(d / "test.csv", lambda df: df.insert(2, "fare", [str(i % 50) for i in range(len(df))]))
        set_cell(d / "train.csv", 5, "fare", "12,5")

    data = spoiled(table_data, tmp_path, spoil)
    out = tmp_path / "out"
    log = train(tabular_project, out, data=data).stdout
    assert re.search(r"^DROP: column 'Name': \d+ distinct values in \d+ rows, id-like or free text", log, re.M), log
    assert "WARNING: column 'fare' is numbers except train.csv line 7 ('12,5'): it is treated as a category" in log
    r = run_script(tabular_project, "predict.py", f"--data-dir={data}", f"--out-dir={out}")
    assert "SUBMISSION:" in r.stdout
    sub = pd.read_csv(out / "submission.csv")
    assert np.isfinite(sub["target"]).all() and sub["target"].between(0, 1).all()


# ----------------------------------------------------------------------------- faults


@pytest.fixture(scope="module")
def trained(image_project, tmp_path_factory):
    """A dry run's output folder (2 folds): the starting point of the checkpoint faults."""
    out = tmp_path_factory.mktemp("trained") / "output"
    run_script(image_project, "train.py", "--dry-run", "--device", "cpu", f"--out-dir={out}")
    return out


def copy_of(trained: Path, tmp_path: Path) -> Path:
    out = tmp_path / "output"
    shutil.copytree(trained, out, ignore=shutil.ignore_patterns(".train.lock"))
    return out


def predict(project: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return run_script(project, "predict.py", "--device", "cpu", f"--out-dir={out}", *args, check=False)


def tamper(path: Path, change) -> None:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)


def _wrong_head(ckpt):
    ckpt["model"]["fc.weight"] = torch.zeros(3, 512)
    ckpt["model"]["fc.bias"] = torch.zeros(3)


def _nan_weights(ckpt):
    ckpt["model"]["fc.bias"] = torch.full_like(ckpt["model"]["fc.bias"], float("nan"))


CHECKPOINT_FAULTS = {
    "weights of another head shape": (_wrong_head, "model_fold1.pth: its weights do not fit the model (Error"),
    "an empty state": (
        lambda c: c.__setitem__("model", {}),
        "model_fold1.pth: its config, classes or weights are empty",
    ),
    "missing keys": (lambda c: c["model"].pop("fc.bias"), "model_fold1.pth: its weights do not fit the model"),
    "other classes": (
        lambda c: c.__setitem__("classes", list(reversed(c["classes"]))),
        "model_fold1.pth: trained with another configuration than the newest checkpoint (classes",
    ),
    "diverged (NaN) weights": (_nan_weights, "model 2 of 2 predicts non-finite values (40 rows"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CHECKPOINT_FAULTS))
def test_a_checkpoint_that_loads_but_does_not_fit_is_skipped(image_project, trained, tmp_path, case):
    change, words = CHECKPOINT_FAULTS[case]
    out = copy_of(trained, tmp_path)
    tamper(out / "model_fold1.pth", change)
    os.utime(out / "model_fold0.pth")  # fold 0 is the newest: the configuration the ensemble follows
    r = predict(image_project, out)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "WARNING: " in r.stdout and words in r.stdout, r.stdout
    assert re.search(r"^SUBMISSION: .* \(40 rows, 1 fold\(s\) ensembled\)$", r.stdout, re.M), r.stdout
    sub = pd.read_csv(out / "submission.csv")
    assert np.isfinite(sub.iloc[:, 1:].to_numpy()).all()


@pytest.mark.slow
@case("faults")
def test_predict_names_the_incomplete_folds_it_uses(image_project, trained, tmp_path):
    out = copy_of(trained, tmp_path)
    tamper(out / "model_fold0.pth", lambda c: c.__setitem__("complete", False))
    r = predict(image_project, out)
    assert (
        "WARNING: model_fold0.pth is from an incomplete fold (stopped early: its best epoch so far, 1); it is used"
        in r.stdout
    )
    assert "model_fold1.pth is from an incomplete fold" not in r.stdout


@pytest.mark.slow
@case("security")
def test_a_malicious_pickle_checkpoint_is_refused_and_never_run(image_project, trained, tmp_path):
    out = copy_of(trained, tmp_path)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Payload(), "config": {}, "classes": []}, out / "model_fold1.pth")
    r = predict(image_project, out)
    assert r.returncode == 0 and not marker.exists()
    assert "WARNING: skipping " in r.stdout and "model_fold1.pth: cannot load" in r.stdout


@pytest.mark.slow
@case("faults")
def test_sigterm_to_the_process_group_with_loader_workers_saves_and_exits_0(image_project, digits_dir, tmp_path):
    """Kaggle signals the whole group: the loader workers get SIGTERM too. They sit in their own
    group (images.worker_init), so the main process saves and exits 0 instead of crashing."""
    out = tmp_path / "out"
    args = ["train.py", "--device", "cpu", "--epochs", "50", "--workers", "2", f"--out-dir={out}"]
    proc, seen = start_until(image_project, args, "Epoch 1:")
    time.sleep(0.5)  # mid-epoch 2, the workers busy
    os.killpg(proc.pid, signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 0, "".join(seen[-5:]) + rest[-3000:]
    assert "STOPPED: " in rest and "SIGTERM" in rest and "killed by signal" not in rest
    assert (out / "model_fold0.pth").exists()


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@case("faults")
def test_a_main_process_killed_outright_takes_its_loader_workers_with_it(image_project, tmp_path):
    """run.py kills a predict.py or train.py still running at the budget. Their loader workers
    sit in their own process group, and lived on until DataLoader's 5 s check noticed, holding
    the run's stdout open: the run ended 5 s past its budget (44 s of 40). The kernel now kills
    them with the main process (PR_SET_PDEATHSIG)."""
    args = ["train.py", "--device", "cpu", "--epochs", "50", "--workers", "2", f"--out-dir={tmp_path / 'out'}"]
    proc, _ = start_until(image_project, args, "Epoch 1:")
    workers = children(proc.pid)
    assert workers and all(alive(w) for w in workers)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(1.0)  # the kernel's kill is immediate; DataLoader's own check comes after 5 s
    assert not [w for w in workers if alive(w)]


def _dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(p.stdout)


@pytest.mark.slow
@case("faults")
def test_a_killed_runs_temp_files_are_swept_and_a_live_writers_kept(image_project, tmp_path):
    out = tmp_path / "out"
    (out / "cache").mkdir(parents=True)
    dead = _dead_pid()
    stale = [out / f".model_fold0.pth.{dead}.k3j_x9a1.tmp", out / "cache" / f".train_32px.u8.{dead}.tmp"]
    for f in stale:
        f.write_bytes(b"\0" * 1_000_000)
    live = out / f".submission.csv.{os.getpid()}.abcdefgh.tmp"  # this test process is alive
    live.write_text("being written")
    r = train(image_project, out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CLEANUP: removed 2 temporary file(s) (2 MB) left by killed runs" in r.stdout
    assert not any(f.exists() for f in stale) and live.exists()


@pytest.mark.slow
@case("faults")
def test_a_second_train_py_on_one_output_folder_refuses_and_a_dead_ones_lock_is_free(image_project, tmp_path):
    out = tmp_path / "out"
    first, _ = start_until(
        image_project, ["train.py", "--device", "cpu", "--epochs", "50", f"--out-dir={out}"], "FOLD 0"
    )
    try:
        second = train(image_project, out)
        one_error(second, "ERROR", f"{out} is in use by another train.py (pid {first.pid})")
    finally:
        first.kill()  # SIGKILL: no chance to clean up; the OS releases its lock
        first.wait()
    r = train(image_project, out)
    assert r.returncode == 0, r.stderr[-2000:]


@case("faults")
def test_disk_full_while_saving_says_so_and_keeps_the_old_file(project_modules, tmp_path):
    """The seam: a write_fn that fills the disk (OSError ENOSPC mid-write, as write(2) raises it)."""
    storage, errors = project_modules.storage, project_modules.errors
    path = tmp_path / "model_fold0.pth"
    path.write_bytes(b"the previous checkpoint")

    def fill_the_disk(tmp):
        Path(tmp).write_bytes(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(
        errors.RunError, match=r"model_fold0.pth: the disk is full \(\d+ MB free\); nothing was replaced"
    ):
        storage.atomic_write(path, fill_the_disk)
    assert path.read_bytes() == b"the previous checkpoint" and [p.name for p in tmp_path.iterdir()] == [path.name]


FULL_DISK_RUNS = """
set -u
disk() {{ mkdir -p "$1" && mount -t tmpfs -o size="$2" tmpfs "$1"; }}
leave() {{ "{python}" -c 'import os, sys; st = os.statvfs(sys.argv[1]); free = st.f_bavail * st.f_frsize
open(os.path.join(sys.argv[1], "filler"), "wb").write(bytes(max(free - int(sys.argv[2]), 0)))' "$1" "$2"; }}
run() {{ name=$1; shift; "{python}" "$@" > "{results}/$name.log" 2>&1; echo $? > "{results}/$name.rc"; }}
# a: a whole run on a disk that holds its checkpoints but not the decode caches besides, nor a grown seed's;
# its budget has time to grow seeds
disk "{disks}/a" 6m
KAGTPL_GROW=on run a run.py --device cpu --budget 3m --image-size 64 {short} --out-dir "{disks}/a/out"
cp -r "{disks}/a/out" "{results}/a_out"
# b: its two trained folds predicted on a disk with 100 KB left: the test cache (480 KB) has no room
disk "{disks}/b" 8m && cp -r "{disks}/a/out" "{disks}/b/out"
rm -rf "{disks}/b/out/submission.csv" "{disks}/b/out/cache" && leave "{disks}/b" 102400
run b predict.py --device cpu --out-dir "{disks}/b/out"
cp -r "{disks}/b/out" "{results}/b_out"
# c: a run whose disk fills up mid-training: fold 0's second save (complete) has no room for its temporary copy
disk "{disks}/c" 2500k && run c run.py --device cpu {short} --out-dir "{disks}/c/out"
cp -r "{disks}/c/out" "{results}/c_out"
# d: a run whose caches were made on the disk (3 GB free then) and whose disk has filled since. d1: fold 1 trained
# again with 1.2 MB left, its 1.5 MB checkpoint fits once the test cache made ahead (1.9 MB) is removed; d: its two
# folds predicted with 4 KB left, the submission fits once the train cache (11.3 MB) is removed
disk "{disks}/d" 3g && run d0 train.py --device cpu {short} --no-grow --image-size 128 --out-dir "{disks}/d/out"
for copy in e f; do disk "{disks}/$copy" 3g && cp -r "{disks}/d/out" "{disks}/$copy/out"; done
rm "{disks}/d/out/model_fold1.pth" "{disks}/f/out/model_fold1.pth"
used=$(df -k "{disks}/d" | tail -1 | awk '{{print $3}}') && mount -o remount,size=$((used + 1200))k "{disks}/d"
run d1 train.py --device cpu {short} --no-grow --image-size 128 --out-dir "{disks}/d/out"
leave "{disks}/d" 4096 && run d predict.py --device cpu --out-dir "{disks}/d/out"
cp -r "{disks}/d/out" "{results}/d_out"
# e: the same run started again with 4 KB left (its folds complete): its fallback fits once the test cache is
# removed, and its training cache, in use, stays
used=$(df -k "{disks}/e" | tail -1 | awk '{{print $3}}') && mount -o remount,size=$((used + 4))k "{disks}/e"
run e train.py --device cpu {short} --no-grow --image-size 128 --out-dir "{disks}/e/out"
cp -r "{disks}/e/out" "{results}/e_out"
# f: fold 1 trained again with 1.6 MB left: its best epoch's checkpoint (1.5 MB) fits, and marking it complete (the
# file written again: a temporary copy beside it) fits once the test cache is removed
used=$(df -k "{disks}/f" | tail -1 | awk '{{print $3}}') && mount -o remount,size=$((used + 1600))k "{disks}/f"
run f train.py --device cpu {short} --no-grow --image-size 128 --out-dir "{disks}/f/out"
# g: stdout sent to a file on a full disk (`nohup python run.py &` writes nohup.out beside the project), the run's
# folder on another: every print is refused
disk "{disks}/g" 64k && leave "{disks}/g" 1024
"{python}" run.py --device cpu {short} --out-dir "{results}/g_out" > "{disks}/g/nohup.out" 2>&1
echo $? > "{results}/g.rc"
"""


def full_disk_log(results: Path, name: str) -> str:
    log = (results / f"{name}.log").read_text()
    assert "Traceback" not in log and "Bus error" not in log and "Exception ignored" not in log, log[-4000:]
    return log


def given_room(results: Path, name: str, cleanup: str) -> str:
    """Run `name`'s log, which ended well (exit 0, no ERROR) after the CLEANUP line `cleanup` (a regex)
    said what gave the refused file its room."""
    log = full_disk_log(results, name)
    assert (results / f"{name}.rc").read_text().strip() == "0" and "ERROR" not in log, log[-3000:]
    assert re.search(cleanup, log, re.M), log
    return log


@pytest.mark.slow
@case("faults")
def test_a_full_disk_costs_no_trained_fold(image_project, digits_dir, tmp_path):
    """Real full disks: tmpfs mounts of a few MB in a mount namespace of the test's own. A decode
    cache's memmap that outgrew the disk was SIGBUS: a run died twice in its train cache and handed
    in no submission, and predict.py died silently beside three trained folds (a hidden test set on
    Kaggle's 20 GB working disk). torch.save meeting ENOSPC raised a RuntimeError traceback, and
    train.log's writes then failed every later line ("lost sys.stderr"). On a disk filled after its caches
    were made, a submission the disk refused was an ERROR beside trained folds (train.py's fallback handed
    in), and a checkpoint, its marking as complete or the fallback, an ERROR that cost the fold: the
    cache (predict.py's; train.py's test set's alone) now gives its room."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m): tmpfs needs one")
    results, disks = tmp_path / "results", tmp_path / "disks"
    results.mkdir()
    short = "--folds 2 --epochs 1"  # 2 checkpoints of 1.5 MB (and the temporary copy of one)
    env = forkpython(RUN_ENV, tmp_path, "images")  # each script forked warm, in the script's mount namespace
    script = FULL_DISK_RUNS.format(python=env["PYTHON"], results=results, disks=disks, short=short)
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=image_project, env=env, timeout=600)
    assert r.returncode == 0
    sample = pd.read_csv(digits_dir / "sample_submission.csv", dtype=str)

    def trained_submission(out: Path) -> None:  # predict.py's ensemble, the sample's rows, not the prior
        sub = pd.read_csv(out / "submission.csv", dtype={sample.columns[0]: str})
        assert list(sub.columns) == list(sample.columns) and list(sub.iloc[:, 0]) == list(sample.iloc[:, 0])
        probs = sub.iloc[:, 1:].to_numpy()
        assert np.isfinite(probs).all() and not (probs == probs[0]).all()

    # a: the caches are held in memory, the checkpoints get the disk; both folds train, and growth stops where the
    # next grown checkpoint would not fit (before: seed 2 fold 0 trained, its save met the full disk: a failed run)
    log = full_disk_log(results, "a")
    assert (results / "a.rc").read_text().strip() == "0", log[-3000:]
    held = r"WARNING: \S+/cache/train_64px\.u8: too little disk \([\d.]+ MB free there; this cache needs 2\.8 MB"
    assert re.search(held + r" and 2048 MB stay free for checkpoints\): held in memory by this process instead", log)
    assert "CACHE: decoded 240 train images to 64x64 in" in log and "-> memory (too little disk)" in log
    assert re.search(r"CACHE: \S+/test_64px\.u8: not made ahead, too little disk .*; predict\.py decodes them", log)
    assert sorted(p.name for p in (results / "a_out").glob("model_fold*.pth")) == [f"model_fold{k}.pth" for k in "01"]
    assert re.search(
        r"^GROW: stop before seed 2 fold 0 \(the disk has [\d.]+ MB free there, a grown fold needs 103 MB: its 1 MB "
        r"checkpoint, the temporary copy each save writes, and 100 MB for its OOF rows and the submission\)$",
        log,
        re.M,
    ), log[-3000:]
    assert "ENSEMBLE: 2 checkpoint(s)" in log and not list((results / "a_out").rglob("*.tmp"))
    assert not list((results / "a_out").glob("*seed*"))
    trained_submission(results / "a_out")
    doctor = kagtpl("doctor", str(results / "a_out" / "train.log"), cwd=tmp_path)  # the agent's reading of it
    assert doctor.returncode == 1 and "STATUS: ACTION NEEDED" in doctor.stdout, doctor.stdout + doctor.stderr
    assert re.search(r"^DISK: the run was short of disk .*train_64px\.u8: too little disk", doctor.stdout, re.M)
    # b: the two folds predicted from test images decoded in memory (before: SIGBUS, no line, no file)
    log = full_disk_log(results, "b")
    assert (results / "b.rc").read_text().strip() == "0", log[-3000:]
    assert re.search(r"WARNING: \S+/cache/test_64px\.u8: too little disk \(0\.1 MB free there;", log), log[-3000:]
    assert log.count("CACHE: decoded 40 test images") == 1  # decoded once, read by each fold
    assert "SUBMISSION: " in log and "(40 rows, 2 fold(s) ensembled)" in log
    trained_submission(results / "b_out")
    # c: one ERROR line naming the file the disk refused; fold 0's saved epoch is handed in
    log = full_disk_log(results, "c")
    assert (results / "c.rc").read_text().strip() == "1", log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1 and re.search(r": the disk is full \(\d+ MB free\); nothing was replaced", errors[0]), log
    assert "RUN: handed in " in log and "predict.py's ensemble of the checkpoints" in log, log[-3000:]
    assert "ENSEMBLE: 1 checkpoint(s), folds [0]" in log and not list((results / "c_out").rglob("*.tmp"))
    trained_submission(results / "c_out")
    rows = pd.read_csv(results / "c_out" / "experiments.csv")
    assert rows["stop"].iloc[-1].startswith("failed: DiskFull: ") and "the disk is full" in rows["stop"].iloc[-1]
    # d1: the disk refused a fold's checkpoint; the test set's cache made ahead gave it room (before: one ERROR, exit 1,
    # the fold lost); d: the disk refused the submission; the train cache gave it room (before: one ERROR, exit 1, and
    # train.py's fallback handed in beside two trained folds); e: the fallback (before: one ERROR, exit 1, no fold);
    # f: a fold's checkpoint marked complete (a copy of it beside it)
    assert "CACHE: decoded 40 test images to 128x128 in" in full_disk_log(results, "d0")  # on the disk: 3 GB free
    # d1 (1.2 MB left) and f (1.6 MB left: the marking's copy; before, one ERROR, exit 1, the fold left incomplete and
    # trained again by the next run): fold 1's checkpoint saved once the test set's cache gave its room
    for name, disk, free in (("d1", "d", r"1\.\d"), ("f", "f", r"0\.\d")):
        log = given_room(
            results,
            name,
            rf"^CLEANUP: the disk refused model_fold1\.pth \({free} MB free\): removed the test set's cache "
            rf"\S+/{disk}/out/cache \(2 file\(s\), 1\.9 MB; predict\.py decodes it again\)$",
        )
        assert "FOLD 1 DONE" in log and "OOF: " in log and "folds [0, 1]" in log, log[-3000:]
    given_room(
        results,
        "d",
        r"^CLEANUP: the disk refused submission\.csv \(0\.0 MB free\): removed the cache \S+/d/out/cache "
        r"\(2 file\(s\), 11\.3 MB; the next run makes it again\)\n"
        r"SUBMISSION: \S+ \(40 rows, 2 fold\(s\) ensembled\)$",
    )
    assert not list((results / "d_out" / "cache").iterdir()) and not list((results / "d_out").rglob("*.tmp"))
    # e: train.py's fallback the disk refused; the test set's cache gave it room, the training cache (in use) stayed
    log = given_room(
        results,
        "e",
        r"^CLEANUP: the disk refused submission\.csv \(0\.0 MB free\): removed the test set's cache \S+/e/out/cache "
        r"\(2 file\(s\), 1\.9 MB; predict\.py decodes it again\)\n"
        r"SUBMISSION: \S+ is a fallback",
    )
    assert sorted(f.name for f in (results / "e_out" / "cache").iterdir()) == ["train_128px.json", "train_128px.u8"]
    assert "FOLD 1: model_fold1.pth is complete, skipping (resume)" in log and "DONE: 2 folds" in log, log[-3000:]
    trained_submission(results / "d_out")
    # g: the console's disk full from the first line: the run goes on and hands in its folds, its lines in train.log
    # (before: train.py died of its next print, OSError 28, and the training prior was handed in, exit 1)
    log = (results / "g_out" / "train.log").read_text()
    assert (results / "g.rc").read_text().strip() == "0" and "Traceback" not in log, log[-3000:]
    assert "DONE: 2 folds" in log
    trained_submission(results / "g_out")


@pytest.mark.slow
@case("faults")
def test_a_test_set_neither_the_disk_nor_the_memory_holds_is_predicted_batch_by_batch(
    image_project, trained, digits_dir, tmp_path
):
    """A hidden test set larger than both the working disk's room and half the memory: its decode
    cache fit nowhere, and predict.py stopped with one ERROR beside trained folds (train.py's
    fallback handed in). Its images are now decoded as the loader's batches ask for them, every
    fold again: the same pixels, so the same submission as from the cache, a bad image blank too.
    A real full disk (a tmpfs mount with 32 KB left: the test cache needs 120 KB)."""
    data = spoiled(digits_dir, tmp_path, lambda d: first_test_image(d).write_bytes(b"not a jpeg"))
    r, streamed = predict_streamed(image_project, trained, data, tmp_path)  # the dry run's test cache left out
    cached = copy_of(trained, tmp_path / "cached")
    shutil.rmtree(cached / "cache", ignore_errors=True)  # decoded again here, from the spoiled test images
    assert predict(image_project, cached, f"--data-dir={data}").returncode == 0
    said = r"^WARNING: \S+/cache/test_32px\.u8: too little disk \(0\.\d MB free there; this cache needs 0\.1 MB "
    said += r"and 2048 MB stay free for checkpoints\), and [\d.]+ MB of memory is available: read as each batch asks, "
    said += r"every fold again; free disk space there, or pass --out-dir on a larger disk$"
    assert re.search(said, r.stdout, re.M) and r.stdout.count("read as each batch asks") == 1, r.stdout  # 2 folds
    assert re.search(r"^WARNING: 1 test image\(s\) missing or not decodable \(first: \S+, ", r.stdout, re.M), r.stdout
    assert re.search(r"^SUBMISSION: \S+ \(40 rows, 2 fold\(s\) ensembled\)$", r.stdout, re.M), r.stdout
    assert streamed == (cached / "submission.csv").read_bytes()


@pytest.mark.slow
@case("faults")
def test_a_replaced_train_image_is_decoded_again_and_found(image_project, digits_dir, tmp_path):
    data = spoiled(digits_dir, tmp_path, lambda d: None)
    out = tmp_path / "out"
    assert train(image_project, out, data=data).returncode == 0
    bad = first_train_image(data)
    bad.write_bytes(b"garbage now")
    r = train(image_project, out, data=data)
    one_error(r, "PREFLIGHT ERROR", f"{bad}: missing or cannot be decoded as an image (labels.csv line 2)")


@pytest.mark.slow
@case("faults")
def test_run_py_reports_a_failed_training_even_when_older_checkpoints_submit(image_project, trained, tmp_path):
    out = copy_of(trained, tmp_path)
    r = run_script(
        image_project, "run.py", "--device", "cpu", f"--out-dir={out}", "--model", "no_such_model", check=False
    )
    assert r.returncode == 1, r.stdout[-2000:]
    assert "RUN: train.py FAILED (exit 1); predicting from the checkpoints there are" in r.stdout
    assert "RUN FAILED: train.py exited 1" in r.stderr and "may be an earlier run's" in r.stderr
    assert (out / "submission.csv").exists()  # still a submission: from the earlier run's folds


@pytest.mark.slow
@case("faults")
def test_a_gpu_projects_dry_run_on_cpu_follows_the_cpu(tmp_path, digits_dir):
    project = render(tmp_path / "a10", data_dir=str(digits_dir), gpu="a10", image_size=64)
    r = train(project, tmp_path / "out", "--workers", "0", "--no-pretrained")  # offline: no ImageNet weights
    assert r.returncode == 0, r.stderr[-2000:]
    assert "WARNING: --gpu a10 but training on cpu: batch and workers follow the CPU profile" in r.stdout
    assert re.search(r"^RESOURCES: \d+ CPU cores, batch=32,", r.stdout, re.M), r.stdout[:600]


@pytest.mark.slow
@case("faults")
def test_the_json_log_carries_the_run_and_whether_it_was_a_dry_run(image_project, trained):
    records = pd.read_json(trained / "train_log.jsonl", lines=True)
    assert records["dry_run"].all() and records["run"].nunique() == 1
    assert re.fullmatch(r"\d{8}-\d{6}-\d+", records["run"][0])


# ----------------------------------------------------------------------------- round two (issue 30)
# A Kaggler's real files and habits: each case failed before its fix (a silently wrong submission,
# no submission, or a traceback) and is counted under "round two" in docs/bad-input.md.


def round_two(n: int = 1):
    """Count a test that covers `n` of round two's cases."""

    def register(test):
        CASES["round two"] += n
        return test

    return register


CASES["round two"] += 1  # an empty test text: tests/test_text.py's dry run and predict.py (a WARNING, a prediction)
CASES["bad data"] += 3  # corrupt, truncated and missing test images: the test just below


@pytest.mark.slow
def test_bad_test_images_are_predicted_from_a_blank_image_with_a_warning(image_project, digits_dir, tmp_path):
    """A hidden test set nobody sees must not lose the submission for one bad row (training data
    stays strict: see IMAGE_DATA_CASES). Corrupt, truncated and missing test images: one WARNING
    with their count in train.py's preflight and in predict.py, and a prediction for every row."""
    tests = sorted((digits_dir / "test").iterdir())

    def spoil(d: Path) -> None:
        (d / "test" / tests[0].name).write_bytes(b"not a jpeg at all")
        (d / "test" / tests[1].name).write_bytes(tests[1].read_bytes()[:60])
        (d / "test" / tests[2].name).unlink()

    data, out = spoiled(digits_dir, tmp_path, spoil), tmp_path / "out"
    r = train(image_project, out, data=data)
    warning = "WARNING: 3 test image(s) missing or not decodable (first: "
    assert r.returncode == 0 and re.search(re.escape(warning) + r".*sample_submission.csv line \d+\)", r.stdout), (
        r.stdout
    )
    r = run_script(image_project, "predict.py", "--device", "cpu", f"--out-dir={out}", f"--data-dir={data}")
    assert warning in r.stdout and "SUBMISSION:" in r.stdout
    sub = pd.read_csv(out / "submission.csv", dtype={"id": str})
    assert len(sub) == 40 and np.isfinite(sub.iloc[:, 1:].to_numpy()).all()


@pytest.mark.slow
@round_two()
def test_a_test_image_corrupted_after_training_still_gets_a_submission(image_project, digits_dir, trained, tmp_path):
    data = spoiled(digits_dir, tmp_path, lambda d: sorted((d / "test").iterdir())[5].write_bytes(b"\xff\xd8junk"))
    out = copy_of(trained, tmp_path)
    r = predict(image_project, out, f"--data-dir={data}")
    assert r.returncode == 0, r.stderr[-2000:]
    said = re.findall(
        r"^WARNING: 1 test image\(s\) missing or not decodable \(first: .*, sample_submission.csv line \d+\)",
        r.stdout,
        re.M,
    )
    assert len(said) == 1, r.stdout  # once, though both folds read the test images
    assert re.search(r"^SUBMISSION: .* \(40 rows, 2 fold\(s\) ensembled\)$", r.stdout, re.M), r.stdout


@pytest.mark.slow
@round_two()
def test_a_class_column_added_to_the_sample_after_training_is_one_line(image_project, digits_dir, trained, tmp_path):
    data = spoiled(
        digits_dir, tmp_path, lambda d: rewrite_csv(d / "sample_submission.csv", lambda df: df.insert(3, "wolf", 0.1))
    )
    out = copy_of(trained, tmp_path)
    before = (out / "submission.csv").read_bytes() if (out / "submission.csv").exists() else None
    r = predict(image_project, out, f"--data-dir={data}")
    one_error(r, "ERROR", "sample_submission has class column(s) ['wolf'] the checkpoints were not trained on")
    train = shlex.join(["python", "train.py", "--data-dir", str(data), "--out-dir", str(out)])  # predict.py's folders
    assert r.stderr.strip().endswith(f"the data changed since training; run {train} again"), r.stderr
    after = (out / "submission.csv").read_bytes() if (out / "submission.csv").exists() else None
    assert after == before  # nothing written


@pytest.mark.slow
@round_two()
def test_a_rerun_after_rows_were_relabelled_retrains_every_fold(image_project, digits_dir, tmp_path):
    """The data's content is in the run signature: a fold trained before a relabelling is
    retrained with a line saying why, never skipped as complete (the stale OOF was reported)."""
    data, out = spoiled(digits_dir, tmp_path, lambda d: None), tmp_path / "out"
    flags = ["--device", "cpu", f"--out-dir={out}", f"--data-dir={data}", "--epochs", "1", "--folds", "2"]
    first = run_script(image_project, "train.py", *flags).stdout
    assert "DONE: 2 folds" in first
    labels = (data / "labels.csv").read_text().splitlines()
    row = next(i for i, line in enumerate(labels) if line.endswith(",one"))
    labels[row] = labels[row][: -len("one")] + "two"  # the same size: only the content differs
    (data / "labels.csv").write_text("\n".join(labels) + "\n")
    again = run_script(image_project, "train.py", *flags).stdout
    assert "skipping (resume)" not in again
    assert again.count("(other data, target or folds): retrained") == 2, again[-3000:]
    assert re.search(r"^FOLD: model_fold0\.pth was trained with run signature \w{12}, this run is \w{12} ", again, re.M)


@pytest.mark.slow
@round_two()
def test_ctrl_c_saves_says_so_and_exits_0_without_a_traceback(image_project, tmp_path):
    """Ctrl-C reaches the terminal's whole process group with SIGINT: it was a 40-line
    KeyboardInterrupt traceback; now it ends training as SIGTERM does (save, say so, exit 0)."""
    out = tmp_path / "out"
    args = ["train.py", "--device", "cpu", "--epochs", "50", "--workers", "1", f"--out-dir={out}"]
    proc, seen = start_until(image_project, args, "Epoch 1:")
    # how the script holds SIGINT when it is sent (ignored, blocked, caught: /proc's masks), for the
    # message of a run that did not stop; such a run ends in three epochs, with every thread's stack. It
    # happened when pytest ran in the background (SIGINT ignored, inherited: conftest now starts scripts
    # as from a terminal), with CatBoost's C handler, installed at the fork server's import, holding it
    held = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Sig")]
    os.killpg(proc.pid, signal.SIGINT)
    after = []  # the lines after the signal, until the STOPPING line or three more epochs without it
    for line in proc.stdout:
        after.append(line)
        if line.startswith("STOPPING") or sum(x.startswith("Epoch") for x in after) >= 3:
            break
    if not any(line.startswith("STOPPING") for line in after):  # where the script is, rather than 50 epochs more
        with contextlib.suppress(ProcessLookupError):  # it may have ended (a KeyboardInterrupt: exit 130)
            proc.send_signal(signal.SIGUSR2)  # the fork server's runners dump every thread's stack on it
            time.sleep(2)
            proc.kill()
        stacks = proc.stdout.read()[-6000:]
        raise AssertionError(f"SIGINT at sending: {held}; lines after it:\n{''.join(after)}{stacks}")
    rest = "".join(after) + proc.stdout.read()
    assert proc.wait(timeout=120) == 0, "".join(seen[-5:]) + rest[-3000:]
    said = "STOPPING: Ctrl-C: saving and ending after this step" in rest and "SIGINT (Ctrl-C)" in rest
    assert said, rest[-3000:]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest  # stderr is in `rest` too
    assert (out / "model_fold0.pth").exists()


@round_two()
def test_atomic_writes_respect_the_umask(project_modules, tmp_path, monkeypatch):
    """mkstemp makes every file 0600: on a shared machine a teammate could not read a checkpoint
    or the submission. The file gets what the umask allows (0664 under umask 002)."""
    storage = project_modules.storage
    monkeypatch.setattr(storage, "UMASK", 0o002)
    storage.atomic_write(tmp_path / "submission.csv", lambda tmp: Path(tmp).write_text("id,label\n"))
    assert (tmp_path / "submission.csv").stat().st_mode & 0o777 == 0o664


def hostile_table(d: Path) -> Path:
    """A churn table as Kaggle ships some: zero-padded ids (and ids "NA", "null", "None"), a
    yes/no target scored by probability (the sample holds 0.5), a region "NA" (North America)
    beside empty cells, a numeric column whose missing values are written NA, a UTF-8 BOM in
    train.csv and header names with spaces around them in test.csv."""
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    ids = [f"{200 + i:05d}" for i in range(80)]
    ids[3], ids[64], ids[70] = "NA", "null", "None"
    region = rng.choice(["NA", "EU", "US", ""], 80)
    size = [("NA" if i % 9 == 0 else f"{v:.2f}") for i, v in enumerate(rng.normal(50, 10, 80))]
    score = rng.normal(0, 1, 80)
    churn = np.where(score + (region == "NA") > 0.3, "yes", "no")
    rows = [f"{ids[i]},{region[i]},{size[i]},{score[i]:.4f}" for i in range(80)]
    train = "row_id,region,size,score,churn\n" + "".join(f"{r},{churn[i]}\n" for i, r in enumerate(rows[:60]))
    (d / "train.csv").write_bytes(b"\xef\xbb\xbf" + train.encode())
    (d / "test.csv").write_text("row_id ,region, size ,score\n" + "".join(f"{r}\n" for r in rows[60:]))
    (d / "sample_submission.csv").write_text("row_id,churn\n" + "".join(f"{i},0.5\n" for i in ids[60:]))
    return d


@pytest.mark.slow
@round_two(5)
def test_a_hostile_table_gives_the_samples_ids_byte_for_byte_and_probabilities(tmp_path):
    """Five cases in one real project (kagtpl new's detection, train.py, predict.py): ids with
    leading zeros and NA words stay text; a yes/no target with a probability sample submits
    probabilities; "NA" is a region, not a missing value; a BOM is read; spaced header names are
    stripped with a WARNING."""
    data = hostile_table(tmp_path / "data")
    r = kagtpl("new", "churn", "--task", "tabular", "--gpu", "cpu", "--data", str(data), "--folds", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    answers = (tmp_path / "churn" / ".copier-answers.yml").read_text()
    assert "id_col: row_id" in answers and "submission: probs" in answers and "metric: auc" in answers, answers
    project, out = tmp_path / "churn", tmp_path / "churn" / "output"
    log = dry_run_into_output(project, "--device", "cpu").stdout
    assert "WARNING: " in log and "header names with spaces around them, read without: ['row_id ', ' size ']" in log
    assert "DROP: column 'region'" not in log and "column 'size' is numbers except" not in log, log
    run_script(project, "predict.py", "--device", "cpu")
    sent = (out / "submission.csv").read_text().splitlines()
    asked = (data / "sample_submission.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in sent] == [line.split(",")[0] for line in asked]  # 00260, not 260
    sub = pd.read_csv(out / "submission.csv", keep_default_na=False)
    assert sub["churn"].between(0, 1).all() and sub["churn"].nunique() > 1  # probabilities of "yes", not labels


def test_kagtpl_new_warns_when_the_metric_given_contradicts_the_sample(tmp_path):
    data = hostile_table(tmp_path / "data")
    r = kagtpl(
        "new", "churn", "--task", "tabular", "--gpu", "cpu", "--data", str(data), "--metric", "accuracy", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert (
        "WARNING: --metric accuracy scores labels, but sample_submission.csv's 'churn' holds numbers (0.5)" in r.stdout
    )


@pytest.mark.slow
@round_two(2)
def test_a_labels_csv_with_a_bom_and_semicolons_is_detected_and_trains(digits_dir, tmp_path):
    """A spreadsheet's export: a UTF-8 BOM, semicolons, spaces around the header names. kagtpl new
    records `id` and `breed` (not '\ufeffid', not "cannot tell the label column among []"), and
    the project reads the file alike."""

    def spoil(d: Path) -> None:
        lines = (d / "labels.csv").read_text().splitlines()
        text = "id ; breed\n" + "".join(line.replace(",", ";") + "\n" for line in lines[1:])
        (d / "labels.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())

    data = spoiled(digits_dir, tmp_path, spoil)
    r = kagtpl(
        "new", "semi", "--task", "image", "--gpu", "cpu", "--data", str(data), "--image-size", "32", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    answers = (tmp_path / "semi" / ".copier-answers.yml").read_text()
    assert "id_col: id\n" in answers and "label_col: breed\n" in answers, answers
    log = run_script(tmp_path / "semi", "train.py", "--dry-run", "--device", "cpu", "--no-pretrained").stdout
    assert "DONE: 2 folds" in log and "header names with spaces around them" in log


def odd_table(d: Path) -> Path:
    """A multiclass table whose sample lists a class train.csv never holds (`wolf`), with column
    names LightGBM and XGBoost refuse: `weight [kg]`, `x<5`, `type: "main"`."""
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    w, x, kind = rng.normal(70, 10, 90), rng.normal(0, 1, 90), rng.choice(["main", "side"], 90)
    y = np.where(x > 0.3, "cat", np.where(x < -0.3, "dog", "cow"))
    rows = [f"{i},{w[i]:.1f},{x[i]:.3f},{kind[i]}" for i in range(90)]
    header = 'id,weight [kg],x<5,"type: ""main"""'
    (d / "train.csv").write_text(header + ",animal\n" + "".join(f"{r},{y[i]}\n" for i, r in enumerate(rows[:70])))
    (d / "test.csv").write_text(header + "\n" + "".join(r + "\n" for r in rows[70:]))
    sample = "id,cat,cow,dog,wolf\n" + "".join(f"{i},0.25,0.25,0.25,0.25\n" for i in range(70, 90))
    (d / "sample_submission.csv").write_text(sample)
    return d


@pytest.mark.slow
@round_two(2)
def test_a_class_train_never_holds_and_names_the_boosters_refuse_train_every_model(tmp_path):
    """LightGBM's fold writer raised `Columns must be same length as key` (3 probability columns
    for the sample's 4), and LightGBM and XGBoost refused the names: now every booster trains
    under names of their own, and the submission has every class of the sample."""
    data = odd_table(tmp_path / "data")
    answers = {"task": "tabular", "id_col": "id", "target": "animal", "problem": "multiclass", "metric": "logloss"}
    project = render(tmp_path / "odd", data_dir=str(data), submission="probs", **answers)
    log = dry_run_into_output(project, "--device", "cpu", "--models", "lgbm,xgb,cat").stdout
    assert "WARNING: class(es) ['wolf'] of sample_submission.csv never occur in " in log, log
    for name in ("lgbm", "xgb", "cat"):
        assert re.search(rf"^OOF: logloss=\d\.\d+ over 70 rows from folds \[0, 1\] \({name}\)$", log, re.M), log
    run_script(project, "predict.py", "--device", "cpu")
    sub = pd.read_csv(project / "output" / "submission.csv")
    assert list(sub.columns) == ["id", "cat", "cow", "dog", "wolf"] and len(sub) == 20
    assert np.allclose(sub.iloc[:, 1:].sum(axis=1), 1) and (sub["wolf"] < 0.01).all()


def _symlink_loop(t: Path) -> list[str]:
    (t / "loop_a").symlink_to(t / "loop_b")
    (t / "loop_b").symlink_to(t / "loop_a")
    return ["--data", str(t / "loop_a")]


def _first_train_image_links_to_itself(t: Path, digits_dir: Path) -> list[str]:
    data = spoiled(digits_dir, t, lambda d: None)
    first = data / "train" / (next(csv_rows(data / "labels.csv"))[0] + ".jpg")
    first.unlink()
    first.symlink_to(first.name)
    return ["--data", str(data)]


def csv_rows(path: Path):
    return (line.split(",") for line in path.read_text().splitlines()[1:])


LINK_CASES = [
    (lambda t, d: _symlink_loop(t), "--data {t}/loop_a: a symlink loop (it leads back to itself)"),
    (lambda t, d: _first_train_image_links_to_itself(t, d), ".jpg: a symlink that leads to itself or nowhere"),
]


@round_two(len(LINK_CASES))
@pytest.mark.parametrize("make,words", LINK_CASES, ids=["--data a symlink loop", "an image linked to itself"])
def test_symlink_loops_are_one_red_line_naming_the_link(digits_dir, tmp_path, make, words):
    """pathlib's RuntimeError traceback, and "pass --image-ext" for an image linked to itself:
    now one line naming the link, and nothing written."""
    r = kagtpl("new", "p", "--task", "image", "--gpu", "cpu", *make(tmp_path, digits_dir), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert words.format(t=tmp_path) in r.stderr and "--image-ext" not in r.stderr, r.stderr
    assert not (tmp_path / "p").exists()


def test_the_projects_preflight_names_a_training_image_linked_to_itself(project_modules, tmp_path):
    image = tmp_path / "a.jpg"
    image.symlink_to("a.jpg")
    with pytest.raises(project_modules.errors.DataError, match="a.jpg: a symlink that leads to itself or nowhere"):
        project_modules.images.check_images_exist([str(image)], "labels.csv")


@round_two()
def test_an_image_past_pils_decompression_bomb_limit_is_measured_with_a_warning(digits_dir, tmp_path):
    """A 14000x14000 scan: PIL's DecompressionBombError was a traceback from kagtpl new. Its
    header is read without decoding (here a real JPEG whose frame header says 14000x14000)."""

    def huge(d: Path) -> None:
        image = sorted((d / "train").iterdir())[0]
        data = bytearray(image.read_bytes())
        frame = data.find(b"\xff\xc0")  # SOF0: length (2), precision (1), height (2), width (2)
        data[frame + 5 : frame + 9] = (14000).to_bytes(2, "big") * 2
        image.write_bytes(bytes(data))

    data = spoiled(digits_dir, tmp_path, huge)
    r = kagtpl("new", "big", "--task", "image", "--gpu", "cpu", "--data", str(data), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    warning = r"^WARNING: 1 training image\(s\) over PIL's decompression-bomb limit .*, 14000x14000\)"
    assert re.search(warning, r.stdout, re.M), r.stdout
    assert "Image size: 32 px" in r.stdout  # the median side: one huge image does not move it


@pytest.mark.slow
@round_two()
def test_images_named_by_their_id_alone_are_found_and_train(digits_dir, tmp_path):
    """Images without an extension: "no training image folder" even with --train-dir, and
    --image-ext '' was ignored. Now found (detected, or given as '') and trained on."""

    def strip(d: Path) -> None:
        for image in [*(d / "train").iterdir(), *(d / "test").iterdir()]:
            image.rename(image.with_suffix(""))

    data = spoiled(digits_dir, tmp_path, strip)
    for name, given in (("found", []), ("given", ["--image-ext", ""])):
        r = kagtpl("new", name, "--task", "image", "--gpu", "cpu", "--data", str(data), *given, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "image_ext: ''\n" in (tmp_path / name / ".copier-answers.yml").read_text()
    log = run_script(tmp_path / "found", "train.py", "--dry-run", "--device", "cpu", "--no-pretrained").stdout
    assert "DONE: 2 folds" in log


@round_two()
def test_a_data_path_with_an_emoji_is_written_into_the_scripts_as_it_is(tmp_path):
    """tojson wrote U+1F4C1 as the surrogate pair \\ud83d\\udcc1, which a Python literal reads as
    two lone surrogates: the data folder was "not found". The scripts now hold the path itself."""
    folder = "/data/📁 comp/ünï"
    project = render(tmp_path / "p", data_dir=folder)
    for script in ("train.py", "run.py"):
        line = next(x for x in (project / script).read_text().splitlines() if x.startswith("DATA_DIR = "))
        assert ast.literal_eval(line.split(" = ", 1)[1]) == folder, line


CASES["round two"] += 1  # a text --model-dir whose pytorch_model.bin carries a pickle payload: tests/test_text.py
CASES["round two"] += 1  # a budget too small for one epoch, said at the first estimate: tests/test_planner.py


class Payload:
    def __reduce__(self):
        return (os.system, ("echo ran > /dev/null",))


def _weights(tmp_path: Path, kind: str) -> Path:
    import timm  # here, not at the top: its import (torchvision, torch._dynamo) cost every worker's collection ~3 s
    from safetensors.torch import save_file

    path = tmp_path / f"{kind}.weights"
    if kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "a pickle payload":
        torch.save({"fc.weight": Payload()}, path)
    else:
        save_file(timm.create_model(kind).state_dict(), path)
    return path


@pytest.mark.slow
@round_two(2)
@pytest.mark.parametrize(
    "kind,words",
    [
        ("random bytes", "not a weights file (neither safetensors nor torch.save's format)"),
        ("a pickle payload", "a pickle that calls posix.system on loading: refused, nothing of it ran"),
    ],
)
def test_a_weights_file_that_is_not_one_is_one_line_naming_it(image_project, tmp_path, kind, words):
    """timm's traceback ended in advice to set weights_only=False; now one line naming the file."""
    weights = _weights(tmp_path, kind)
    one_error(train(image_project, tmp_path / "out", f"--weights={weights}"), "ERROR", f"--weights {weights}: {words}")


@pytest.mark.slow
@round_two()
def test_weights_of_another_model_are_refused_or_a_one_line_warning_with_the_shares(image_project, tmp_path):
    """A partial load was exit 0 after a wall of unexpected keys. resnet34's weights fit every
    resnet18 tensor (the same blocks, more of them): one WARNING line with both shares.
    efficientnet_b0's fit none: refused."""
    r = train(image_project, tmp_path / "a", "--model=resnet18", f"--weights={_weights(tmp_path, 'resnet34')}")
    assert r.returncode == 0, r.stderr[-2000:]
    said = [line for line in r.stdout.splitlines() if line.startswith("WARNING: --weights ")]
    assert len(said) == 1 and re.search(r"100% of resnet18's weights loaded, 4\d% of the file's unused", said[0]), said
    assert "Unexpected key" not in r.stdout + r.stderr
    weights = _weights(tmp_path, "efficientnet_b0")
    r = train(image_project, tmp_path / "b", "--model=resnet18", f"--weights={weights}")
    one_error(r, "ERROR", f"--weights {weights}: only 0% of resnet18's weights are in it")


@pytest.mark.slow
@round_two()
def test_drop_leaves_out_a_column_only_test_csv_has(tabular_project, table_data, tmp_path):
    """An extra column in test.csv was a clear error, but `--drop leak` was refused (not a column
    of train.csv), so a read-only Kaggle input could not be used as shipped."""
    data = tmp_path / "data"
    shutil.copytree(table_data, data)
    rewrite_csv(data / "test.csv", lambda df: df.insert(2, "leak", 1))
    r = train(tabular_project, tmp_path / "out", "--models=mlp", data=data)
    one_error(r, "PREFLIGHT ERROR", "column 'leak' is not a column of train.csv; pass --drop leak to leave it out")
    r = train(tabular_project, tmp_path / "out", "--models=mlp", "--drop=leak", data=data)
    assert r.returncode == 0 and "DONE: 2 folds" in r.stdout, r.stderr[-2000:]
    r = run_script(
        tabular_project, "predict.py", "--device", "cpu", f"--out-dir={tmp_path / 'out'}", f"--data-dir={data}"
    )
    assert "SUBMISSION:" in r.stdout


@pytest.mark.slow
@round_two()
def test_run_from_another_folder_writes_into_the_project(table_data, tmp_path):
    """`python /proj/run.py` could not find train.py, and `python /proj/train.py` wrote ./output
    in the caller's folder: the project's own files are found and written beside the scripts."""
    answers = {"task": "tabular", "id_col": "row_id", "target": "target", "problem": "binary", "metric": "auc"}
    project = render(tmp_path / "proj", data_dir=str(table_data), submission="probs", **answers)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # `python /proj/run.py ...` in `elsewhere`, through the fork server as the tests' scripts start (a table's
    # project: the plain server, as `elsewhere` has no machinery/); 14.0 s of the suite started cold
    r = run_script(elsewhere, str(project / "run.py"), "--device=cpu", "--dry-run", "--models=mlp", timeout=300)
    out = project / "output" / "dry-run"  # a dry run's own folder: predict.py was told it by run.py
    assert (out / "submission.csv").is_file() and (out / "model_fold0.pth").is_file()
    assert not list(elsewhere.iterdir())
    assert f"SUBMISSION: {out / 'submission.csv'}" in r.stdout
    # the DRY RUN line names the scripts' folder too: run as written in `elsewhere`, it predicts; the
    # DONE line under run.py names run.py's own predict.py, already started (a second one would predict beside it)
    assert f"; python {project / 'predict.py'} --out-dir {out} predicts with it\n" in r.stdout, r.stdout[-3000:]
    assert "; next: run.py's predict.py (started beside train.py) hands in; its RUN: line says what\n" in r.stdout


@pytest.mark.slow
@round_two()
def test_predict_py_on_a_folder_train_py_never_wrote_gives_the_command_that_writes_it(tabular_project, tmp_path):
    """`python predict.py --out-dir 'exp 1'` before any train.py wrote that folder said `run train.py
    first`: run as written, that trained into output/ and predict.py stopped again. The line gives
    the train.py command with predict.py's folder; run as written, it writes what predict.py reads."""
    out = tmp_path / "exp 1"
    r = run_script(tabular_project, "predict.py", "--device=cpu", f"--out-dir={out}", check=False)
    one_error(r, "ERROR", "first (nothing was written)")
    command = re.search(r": run (python .+) first \(nothing was written\)$", r.stderr.strip())
    assert command and shlex.split(command[1]) == ["python", "train.py", "--out-dir", str(out)], r.stderr
    assert not out.exists() or not list(out.iterdir())  # predict.py wrote nothing
    script, *flags = shlex.split(command[1])[1:]
    run_script(tabular_project, script, *flags, "--dry-run", "--device=cpu", "--models=mlp")  # a short run of it
    assert (out / "model_fold0.pth").is_file()
    r = run_script(tabular_project, "predict.py", "--device=cpu", f"--out-dir={out}")
    assert f"SUBMISSION: {out / 'submission.csv'}" in r.stdout, r.stdout[-2000:]


@pytest.mark.slow
@round_two()
def test_a_data_folder_holding_the_run_folder_is_refused_and_one_holding_the_project_resumes(table_data, tmp_path):
    """The data beside train.py (`--data-dir .`): each run's files changed the data's run signature,
    and every rerun trained each fold again as "other data" (run.py's restart after a crash too).
    Refused before anything is written. A project made inside the competition's folder (`kagtpl
    new` run there): the data's fingerprint leaves the project out, and a rerun resumes."""
    comp = tmp_path / "comp"
    shutil.copytree(table_data, comp)
    answers = {"task": "tabular", "id_col": "row_id", "target": "target", "problem": "binary", "metric": "auc"}
    project = render(comp / "tab", data_dir=str(comp), submission="probs", **answers)
    short = ("--device=cpu", "--models=mlp", "--folds=2", "--epochs=1")
    for script, flags, words in [
        ("train.py", ("--data-dir=.", "--out-dir=run 1"), "--out-dir run 1 is inside --data-dir .: "),
        ("run.py", ("--data-dir=.", "--out-dir=run 1"), "--out-dir run 1 is inside --data-dir .: "),
        ("tune.py", ("--data-dir=.", "--out-dir=run 1"), "--out-dir run 1 is inside --data-dir .: "),
        ("train.py", ("--out-dir=../runs",), "--out-dir ../runs is inside --data-dir "),  # in the data, not the project
    ]:
        one_error(run_script(project, script, *short, *flags, check=False), "ERROR", words)
    assert not (project / "run 1").exists() and not (comp / "runs").exists()  # nothing written
    first = run_script(project, "train.py", *short).stdout
    assert first.count(" DONE: best val loss") == 2, first[-2000:]
    again = run_script(project, "train.py", *short).stdout
    assert again.count("is complete, skipping (resume)") == 2 and "retrained" not in again, again[-2000:]


# ----------------------------------------------------------------------------- the counts in docs/

COUNTS = {
    "kagtpl command line": len(CLI_CASES) + CASES["kagtpl command line"],
    "generated scripts' flags": len(FLAG_CASES) + len(TABULAR_FLAG_CASES) + len(PREDICT_FLAG_CASES),
    "bad data": len(IMAGE_DATA_CASES) + len(TABULAR_DATA_CASES) + CASES["bad data"],
    "faults": len(CHECKPOINT_FAULTS) + CASES["faults"],
    "round two": CASES["round two"],
    "security": len(SECURITY_CLI_CASES) + len(SECURITY_DATA_CASES) + CASES["security"],
}


def test_the_docs_count_these_cases():
    doc = (ROOT / "docs" / "bad-input.md").read_text()
    found = {k: int(v) for k, v in re.findall(r"^\| ([a-z' ]+) \| (\d+) \|", doc, re.M)}
    assert found == COUNTS, f"docs/bad-input.md's table says {found}; the tests try {COUNTS}"
    assert f"{sum(COUNTS.values())} cases, each a test" in (ROOT / "README.md").read_text()
