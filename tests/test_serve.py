"""serve.py against Kaggle's evaluation API: the generated project's server, built from the
competition's own `kaggle_evaluation` package (here tests/standin/kaggle_evaluation, a stand-in
written from the real package's public interface), answers a gateway in another process over
gRPC, batch by batch, with the first-call and per-call limits."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import textdata
import yaml
from test_text import text_project

from conftest import ROOT, RUN_ENV, dry_run_into_output, free_port, render, run_script
from kagtpl import new, shapes, sounds, table

pytestmark = pytest.mark.slow

TABULAR = {
    "task": "tabular",
    "gpu": "cpu",
    "id_col": "row_id",
    "folds": 3,
    "epochs": 4,
    "problem": "binary",
    "metric": "auc",
    "target": "target",
    "submission": "probs",
    "competition": "stream-comp",
}
STANDIN = ROOT / "tests" / "standin" / "kaggle_evaluation"


def serve_env(**extra) -> dict:
    return {**RUN_ENV, "KAGGLE_EVALUATION_PORT": str(free_port()), **{k: str(v) for k, v in extra.items()}}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A trained tabular project (3 folds of LightGBM, XGBoost, CatBoost and the MLP) whose data
    folder holds the competition's evaluation package, as Kaggle ships it; its table has a date
    column, made numbers by train.py's add_features in train.py, predict.py and serve.py alike."""
    root = tmp_path_factory.mktemp("serve")
    data = table.write_table(root / "data", "binary")
    for name in ("train.csv", "test.csv"):  # a date column: every batch goes through train.py's add_features
        rows = pd.read_csv(data / name)
        days = pd.to_timedelta(np.arange(len(rows)) % 400, unit="D")
        rows.insert(2, "visit", (pd.Timestamp("2023-01-01") + days).strftime("%Y-%m-%d"))
        rows.to_csv(data / name, index=False)
    shutil.copytree(STANDIN, data / "kaggle_evaluation")
    project = render(root / "comp", data_dir=str(data), **TABULAR)
    log = run_script(project, "train.py", "--models", "lgbm,xgb,cat,mlp", "--device", "cpu").stdout
    assert "DATES: visit -> visit_year, " in log, log[:3000]
    run_script(project, "predict.py", "--device", "cpu")
    return project


def user_code(project: Path, code: str) -> str:
    """Add code to predict.py before its main block, as a user edits it (a later def of
    predict_batch wins on import); returns the file as it was."""
    path = project / "predict.py"
    text = path.read_text()
    path.write_text(text.replace('\n\nif __name__ == "__main__":', f'\n\n{code}\n\nif __name__ == "__main__":'))
    return text


def user_predict_batch(project: Path, body: str) -> str:
    """Replace predict.py's predict_batch with one of this body."""
    return user_code(project, f"def predict_batch(ensemble, state, batch, *more):\n{body}\n")


def test_dry_run_answers_like_predict_py(served):
    """The full local run: every batch answered (polars in, polars out), the same numbers as
    predict.py's submission.csv from the same folds, and the dry run's own check."""
    log = run_script(served, "serve.py", "--device", "cpu", env=serve_env(STANDIN_BATCH_ROWS=20)).stdout
    test_rows = len(pd.read_csv(served.parent / "data" / "test.csv"))
    calls = -(-test_rows // 20)
    assert "SERVE: ensemble: mlp 3 fold(s), cat 3 fold(s), lgbm 3 fold(s), xgb 3 fold(s)" in log, log
    assert re.search(r"^SERVE: started [\d.]+s after the start, of the 900s serving deadline$", log, re.M), log
    assert re.search(rf"^SERVE: dry run done in [\d.]+s: {calls} call\(s\), {test_rows} rows, 0 fallback", log, re.M)
    assert f"SERVE: submission.parquet: {test_rows} rows, columns ['row_id', 'target'], 0 missing value(s)" in log
    assert "WARNING" not in log
    served_sub = pd.read_parquet(served / "submission.parquet").set_index("row_id")
    batch_sub = pd.read_csv(served / "output" / "submission.csv", dtype={"row_id": str}).set_index("row_id")
    assert set(served_sub.index) == set(batch_sub.index)
    diff = (served_sub["target"] - batch_sub.loc[served_sub.index, "target"]).abs().max()
    assert diff < 1e-5, diff


def test_tree_fold_files_predict_what_train_py_predicted(served):
    """Each booster's fold, loaded back from its own file format (LightGBM .txt, XGBoost .ubj,
    CatBoost .cbm) and asked for the test rows as the table has them (the 'grade' category with
    the training fold's levels, a value it never saw, gaps; the dates made numbers by train.py's
    add_features), gives the numbers train.py wrote."""
    code = """
import numpy as np, pandas as pd
from pathlib import Path
from machinery import storage, trees
from train import add_features
test = add_features(storage.read_csv(Path(DATA) / "test.csv"), storage.read_config(Path("output"))[0])
test.loc[test.index[:3], "grade"] = ["unseen", None, "mid"]
for name, specs in sorted(trees.read_specs(Path("output")).items()):
    for path, spec in specs:
        fold = trees.load(path, spec)
        written = pd.read_csv(f"output/test_{name}_fold{spec['fold']}.csv")[["p_0", "p_1"]].to_numpy()
        again = trees.predict_rows(fold, test)
        print(name, spec["fold"], type(fold.model).__name__, np.abs(again[3:] - written[3:]).max(), again.shape)
"""
    data = served.parent / "data"
    out = run_script(served, "-c", code.replace("DATA", repr(str(data)))).stdout
    rows = out.strip().splitlines()
    assert len(rows) == 9 and {r.split()[0] for r in rows} == {"cat", "lgbm", "xgb"}, out
    for row in rows:
        name, fold, kind, diff, *shape = row.split()
        assert float(diff) < 1e-9 and "".join(shape) == "(113,2)", row


def test_trees_alone_answer_like_predict_py(served, tmp_path):
    """Without the MLP (an output folder of the trees' files alone), serve.py answers with the
    trees' blend, weighted on their OOF files as predict.py weighs them: the same numbers."""
    out = tmp_path / "trees"
    shutil.copytree(served / "output", out, ignore=shutil.ignore_patterns("model_fold*", "submission.csv"))
    run_script(served, "predict.py", "--device", "cpu", "--out-dir", str(out))
    env = serve_env(STANDIN_BATCH_ROWS=40)
    log = run_script(served, "serve.py", "--device", "cpu", "--out-dir", str(out), env=env).stdout
    assert "SERVE: ensemble: cat 3 fold(s), lgbm 3 fold(s), xgb 3 fold(s)" in log, log
    assert re.search(r"^BLEND: weights .* -> OOF auc=", log, re.M) and "WARNING" not in log, log
    served_sub = pd.read_parquet(served / "submission.parquet").set_index("row_id")
    batch_sub = pd.read_csv(out / "submission.csv", dtype={"row_id": str}).set_index("row_id")
    diff = (served_sub["target"] - batch_sub.loc[served_sub.index, "target"]).abs().max()
    assert len(served_sub) == len(batch_sub) and diff < 1e-6, diff


def test_defaults_of_another_run_are_refused(served, tmp_path):
    """serve_defaults.json of a newer run on other data (stopped before its first fold) beside
    the older run's folds: one ERROR line naming both signatures, before any answer. None at all:
    one ERROR line with the command that writes it."""
    out = tmp_path / "mixed"
    shutil.copytree(served / "output", out)
    defaults = json.loads((out / "serve_defaults.json").read_text())
    made = defaults["signature"]
    (out / "serve_defaults.json").write_text(json.dumps({**defaults, "signature": "0123456789ab"}))
    r = run_script(served, "serve.py", "--device", "cpu", "--out-dir", str(out), check=False, env=serve_env())
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ERROR: serve_defaults.json was written by a train.py run of signature 0123456789ab")
    assert f"by one of {made}" in r.stderr and "SERVE: call" not in r.stdout
    # as the line says: train.py again on the older run's data writes its defaults back, keeps its folds
    assert r.stderr.strip().endswith("the older one's writes serve_defaults.json again and keeps its complete folds)")
    models = ("--models", "lgbm,xgb,cat,mlp")
    log = run_script(served, "train.py", *models, "--device", "cpu", "--out-dir", str(out)).stdout
    assert log.count("is complete, skipping (resume)") == 12 and " DONE: " not in log, log[-3000:]  # 4 models x 3
    assert json.loads((out / "serve_defaults.json").read_text())["signature"] == made
    # none at all: the line gives the train.py command that writes this folder, to run as written
    (out / "serve_defaults.json").unlink()
    r = run_script(served, "serve.py", "--device", "cpu", "--out-dir", str(out), check=False, env=serve_env())
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    train = shlex.join(["python", "train.py", "--out-dir", str(out)])
    assert r.stderr.strip().endswith(f"train.py writes it with its fallback submission; run {train} first"), r.stderr


def test_lines_that_ask_for_a_train_py_run_give_the_command_that_writes_the_folder(served, tmp_path):
    """serve.py on an --out-dir whose train.py run has written its serve_defaults.json but no fold
    (stopped before its first): one ERROR line whose command trains that folder, not output/. The
    trees alone with oof_xgb.csv cut short: the BLEND line's command writes it again into that folder."""
    out = tmp_path / "trained here"
    shutil.copytree(served / "output", out, ignore=shutil.ignore_patterns("model_fold*", "submission.csv"))
    train = shlex.join(["python", "train.py", "--out-dir", str(out)])
    oof = (out / "oof_xgb.csv").read_bytes()
    (out / "oof_xgb.csv").write_bytes(oof[: len(oof) // 2])  # cut short after its atomic write
    log = run_script(served, "serve.py", "--device", "cpu", "--out-dir", str(out), env=serve_env()).stdout
    line = next(x for x in log.splitlines() if x.startswith("BLEND: xgb left out: "))
    assert "does not read back" in line and line.endswith(f"; {train} --models xgb writes it again"), log
    for path in out.glob("tree_*_fold*.json"):
        path.unlink()
    r = run_script(served, "serve.py", "--device", "cpu", "--out-dir", str(out), check=False, env=serve_env())
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    want = f"no model_fold*.pth and no tree_*_fold*.json in {out}: run {train} first (nothing was written)"
    assert r.stderr.strip() == f"ERROR: {want}", r.stderr


def test_state_raise_and_late_call_fall_back(served):
    """State kept across calls (the user's function counts them); call 3 raises, call 5 is past its
    limit: both answered by the fallback with a WARNING, and the run goes on to the last batch."""
    original = user_predict_batch(
        served,
        "    import time\n"
        "    state['calls'] = state.get('calls', 0) + 1\n"
        "    if state['calls'] == 3:\n"
        "        raise ValueError('a bad batch')\n"
        "    if state['calls'] == 5:\n"
        "        time.sleep(2.5)\n"
        "    ids = serving.to_pandas(batch)['row_id']\n"
        "    return pd.DataFrame({'row_id': ids, 'target': state['calls'] / 100})",
    )
    try:
        env = serve_env(STANDIN_BATCH_ROWS=20, STANDIN_CALL_LIMIT=2, STANDIN_FRAME="pandas")
        log = run_script(served, "serve.py", "--device", "cpu", "--call-limit", "2", env=env).stdout
    finally:
        (served / "predict.py").write_text(original)
    fallback = "answered with the fallback (the last good answer's values)"
    assert f"WARNING: SERVE: call 3 raised ValueError: a bad batch: {fallback}" in log
    assert re.search(
        r"^WARNING: SERVE: call 5 still running after 1\.\d+s \(80% of its 2s limit\): answered", log, re.M
    )
    assert re.search(r"^SERVE: dry run done in [\d.]+s: 6 call\(s\), 113 rows, 2 fallback\(s\)", log, re.M), log
    sub = pd.read_parquet(served / "submission.parquet")
    per_call = [round(v, 4) for v in sub.groupby(sub.index // 20)["target"].first()]
    # calls 1, 2 answered 0.01, 0.02; 3 the fallback (call 2's mean); 4 answers 0.04; 5 the
    # fallback (call 4's); the late call 5 finished before call 6 ran, so 6 counts it: 0.06
    assert per_call == [0.01, 0.02, 0.02, 0.04, 0.04, 0.06], per_call


def test_startup_past_the_deadline_drops_folds(served):
    """A start-up that would pass the serving deadline loads the best fold alone and says so."""
    started = time.time() - 1000
    env = serve_env(STANDIN_FRAME="pandas")
    log = run_script(served, "serve.py", "--device", "cpu", "--started", str(started), env=env).stdout
    assert re.search(r"^SERVE: start-up: 2 fold\(s\) dropped \(model_fold\d.pth, model_fold\d.pth\)", log, re.M), log
    assert re.search(r"^SERVE: start-up: 2 fold\(s\) dropped \(tree_cat_fold\d.json, tree_cat_fold\d.json\)", log, re.M)
    assert "SERVE: ensemble: mlp 1 fold(s), cat 1 fold(s), lgbm 1 fold(s), xgb 1 fold(s)" in log
    assert "(past it: the gateway may have given up)" in log
    assert re.search(r"^SERVE: dry run done in [\d.]+s: \d+ call\(s\), 113 rows, 0 fallback", log, re.M), log


# ----------------------------------------------------------------------------- every other task's serve.py

# What a user's predict_batch may do to serve.py: count its calls in `state`, raise on call 2 and
# pass the 4 s call limit on call 3 (the project's own predict_batch answers the others). 4 s, not
# 2: the late call's thread still runs its prediction beside call 4, and a text model's call 4
# took 1.6 s of a loaded 2-core CI machine's time (CI of 4009272).
FLAKY_PREDICT_BATCH = """
_project_predict_batch = predict_batch


def predict_batch(ensemble, state, batch, *more):
    import time

    state["calls"] = state.get("calls", 0) + 1
    if state["calls"] == 2:
        raise ValueError("a bad batch")
    if state["calls"] == 3:
        time.sleep(4.5)
    return _project_predict_batch(ensemble, state, batch, *more)
"""


# predict.py with sklearn unimportable (every sklearn module the fork server preloaded made None): each
# task's train.py, which predict.py and serve.py import, imports sklearn where it scores or splits, not
# at the top, so a cold predict.py (run.py starts one beside train.py) never pays its ~1 s of imports
WITHOUT_SKLEARN = """
import runpy, sys
for name in [m for m in sys.modules if m.split(".")[0] == "sklearn"] + ["sklearn"]:
    sys.modules[name] = None
sys.argv = ["predict.py", *sys.argv[1:]]
runpy.run_path("predict.py", run_name="__main__")
"""


@pytest.fixture(scope="module", params=["image", "text", "segmentation", "detection", "audio"])
def served_task(request, tmp_path_factory, digits_dir) -> tuple[Path, Path, int]:
    """A project of another task, trained by --dry-run (2 folds), whose competition folder holds
    the evaluation package: (project, the file its gateway sends in batches, rows per batch), 4
    batches in all. image: 40 test digits named by id; text: 40 toxic comments; segmentation: 8 shapes
    images (PNG masks, RLE answers); detection: 8 images of boxes (prediction strings); audio: the
    8 five-second windows of 2 spoken-word soundscapes (BirdCLEF's row ids, read from the test
    folder; on CPU each fold's CNN runs in ONNX Runtime, in predict.py and serve.py alike).
    Its predict.py runs without sklearn (WITHOUT_SKLEARN)."""
    task = request.param
    root = tmp_path_factory.mktemp(f"serve-{task}")
    if task == "image":
        data = Path(shutil.copytree(digits_dir, root / "data"))
        project = render(root / "comp", data_dir=str(data))
    elif task == "text":
        data = textdata.write_toxic(root / "data", n_test=40)  # six labels, each its own probability (multilabel)
        project = text_project(root / "comp", data, "toxic")
    elif task == "audio":
        data = sounds.write_sounds(root / "data", "folders", clips_per_word=3, test=2, windows=4)
        project = render(root / "comp", task="audio", data_dir=str(data), folds=2)
    else:
        write = shapes.write_shapes if task == "segmentation" else shapes.write_boxes
        data = write(root / "data", "png" if task == "segmentation" else "wheat", 24, 8, 96)
        plan = {"folds": 2, "image_size": 64}
        project = new.new_project(new.NewAnswers(name="comp", task=task, gpu="cpu", data=data, dest=root, **plan))
    shutil.copytree(STANDIN, data / "kaggle_evaluation")
    dry_run_into_output(project, "--device", "cpu")
    run_script(project, "-c", WITHOUT_SKLEARN, "--device", "cpu")
    sent = data / ("test.csv" if task == "text" else "sample_submission.csv")
    return project, sent, 10 if task in ("image", "text") else 2


def test_every_task_keeps_state_falls_back_and_drops_folds(served_task):
    """The user's function keeps a count in `state`; call 2 raises and call 3 is late: both are
    answered with call 1's values (each number column's mean, another's most common value), with
    a WARNING; masks and boxes with train.py's fallback (the empty masks, no boxes) instead, never
    call 1's (another image's mask pasted on these scored below none). A start-up already past
    the serving deadline loads the best fold alone."""
    project, sent, rows = served_task
    task = yaml.safe_load((project / ".copier-answers.yml").read_text())["task"]
    fallback = {"segmentation": "the empty masks", "detection": "no boxes"}.get(task)
    original = user_code(project, FLAKY_PREDICT_BATCH)
    try:
        env = serve_env(STANDIN_BATCH_ROWS=rows, STANDIN_CALL_LIMIT=4, STANDIN_FRAME="pandas")
        started = str(time.time() - 1000)
        flags = ["--device", "cpu", "--data-paths", str(sent), "--call-limit", "4", "--started", started]
        log = run_script(project, "serve.py", *flags, env=env).stdout
    finally:
        (project / "predict.py").write_text(original)
    assert "SERVE: start-up: 1 fold(s) dropped" in log and "SERVE: ensemble: 1 fold(s)" in log, log
    source = fallback or "the last good answer's values"
    assert f"WARNING: SERVE: call 2 raised ValueError: a bad batch: answered with the fallback ({source})" in log, log
    assert re.search(r"^WARNING: SERVE: call 3 still running after 3\.\d+s \(80% of its 4s limit\)", log, re.M)
    assert re.search(rf"^SERVE: dry run done in [\d.]+s: 4 call\(s\), {4 * rows} rows, 2 fallback", log, re.M), log
    sub = pd.read_parquet(project / "submission.parquet")
    first = sub.iloc[:rows, 1:]
    if fallback:  # every image of calls 2 and 3 predicts nothing (a dry run's call 1 may too: the unit
        assert (sub.iloc[rows : 3 * rows, -1] == "").all(), sub  # test_stops' gives call 1 a mask)
        return
    for column in first.columns:
        numeric = pd.api.types.is_numeric_dtype(first[column])
        expected = first[column].mean() if numeric else first[column].mode().iloc[0]
        given = sub[column].iloc[rows : 3 * rows]
        assert (given.sub(expected).abs().max() < 1e-6) if numeric else (given == expected).all(), (column, given)


@pytest.mark.parametrize("served_task", ["detection"], indirect=True)
def test_a_row_per_box_run_is_refused_before_any_fold_loads(served_task, tmp_path):
    """A detection run trained with --pred-style rows writes a row per box, and a gateway takes one
    answer row per batch row: serve.py refuses it in one line, before it loads a fold
    (predict.one_row_per_image, serve_folds' check)."""
    import torch

    project, sent, rows = served_task
    out = Path(shutil.copytree(project / "output", tmp_path / "out"))
    for path in out.glob("model_fold*.pth"):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        ckpt["config"]["pred_style"] = "rows"
        torch.save(ckpt, path)
    flags = ["--device", "cpu", "--out-dir", str(out), "--data-paths", str(sent), "--call-limit", "1"]
    r = run_script(project, "serve.py", *flags, check=False, env=serve_env(STANDIN_BATCH_ROWS=rows))
    assert r.returncode == 1 and "SERVE: ensemble" not in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "ERROR: --pred-style rows writes a row per box, and a gateway takes one answer row per batch row: "
        "serve a prediction string per image (--pred-style string)"
    ), r.stderr[-2000:]


ABORTIVE_GATEWAY = """
import atexit, os


class AbortsAtExit:  # its work done, a library's teardown at the process's exit aborts it (Arrow's pool did)
    def __init__(self, data_paths):
        pass

    def run(self):
        atexit.register(os.abort)


class Raises:
    def __init__(self, data_paths):
        pass

    def run(self):
        raise RuntimeError("the gateway's own error")
"""


@pytest.mark.onecore  # two short processes, one at a time; nothing trained or timed
def test_the_stand_in_gateway_process_ends_with_its_work_not_its_libraries_teardown(tmp_path):
    """The stand-in's gateway process (its own process, unlike the real package's thread) exits by
    os._exit once its work is done: an abort in a library's teardown at exit (Arrow's, apache/arrow
    issue 34314, seen once in CI) is no gateway failure; an error of its own still is, as its last line."""
    (tmp_path / "abortive.py").write_text(ABORTIVE_GATEWAY)
    env = {**RUN_ENV, "PYTHONPATH": os.pathsep.join([str(STANDIN.parent), str(tmp_path)])}

    def gateway(name: str) -> subprocess.CompletedProcess:
        args = [sys.executable, "-m", "kaggle_evaluation.core.gateway_process", "abortive", name, "null"]
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)

    done = gateway("AbortsAtExit")
    assert done.returncode == 0, (done.returncode, done.stderr)
    failed = gateway("Raises")
    assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1] == "RuntimeError: the gateway's own error"


def test_no_package_is_one_error_line(served, tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    r = run_script(served, "serve.py", "--data-dir", str(empty), check=False, env=serve_env())
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"ERROR: no kaggle_evaluation/*_inference_server.py in {empty}: serve.py is for competitions served "
        "through Kaggle's evaluation API, which ship that package with their data (--data-dir)"
    ]


def serve_notebook(project: Path, data: Path, sent: str, root: Path, monkeypatch, *flags) -> tuple[str, Path]:
    """kagtpl kaggle --serve, then its notebook under nbclient in a Kaggle tree simulated under
    `root` (the competition's data and the code and weights datasets attached), with
    KAGGLE_IS_COMPETITION_RERUN set: the kernel serves, and a gateway process of the rerun's kind
    sends `sent` (a file of the competition's) batch by batch, then the kernel is killed, as Kaggle
    ends the session. Returns what the notebook printed and the gateway's folder."""
    import nbformat
    from nbclient import NotebookClient

    # through the fork server, as the project's scripts: `kagtpl kaggle` reads the checkpoints with torch
    # (3-4 s of imports in a new interpreter); the CLI's own start is tests/test_kaggle.py's
    run_script(project, "-m", "kagtpl", "kaggle", str(project), "--user", "alice", "--no-wheels", "--serve", *flags)
    meta = json.loads((project / "kaggle" / "kernel-metadata.json").read_text())
    competition = root / "input" / "competitions" / meta["competition_sources"][0]
    shutil.copytree(data, competition)
    for source in meta["dataset_sources"]:  # alice/comp-code: kaggle/code
        shutil.copytree(project / "kaggle" / source.rsplit("-", 1)[1], root / "input" / source.split("/")[1])
    (root / "working").mkdir()
    env = {"KAGGLE_ROOT": str(root), "KAGGLE_KERNEL_RUN_TYPE": "Batch", "KAGGLE_IS_COMPETITION_RERUN": "1"}
    env["KAGGLE_EVALUATION_PORT"] = str(free_port())
    for key, value in {**RUN_ENV, **env}.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(project / "kaggle" / "notebook.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(root)}})
    ended: list = []
    kernel = threading.Thread(target=lambda: ended.append(run_until_killed(client)), daemon=True)
    kernel.start()
    gateway_dir = root / "gateway"
    gateway_dir.mkdir()
    args = ["kaggle_evaluation.kagtpl_gateway", "KagtplGateway", json.dumps([str(competition / sent)])]
    gateway_env = {**os.environ, "PYTHONPATH": str(competition), "KAGGLE_EVALUATION_HOST": "localhost"}
    done = subprocess.run(
        [sys.executable, "-m", "kaggle_evaluation.core.gateway_process", *args],
        cwd=gateway_dir,
        env=gateway_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    os.kill(client.km.provisioner.pid, signal.SIGKILL)  # Kaggle ends the session once the gateway is done
    kernel.join(60)
    printed = "\n".join(o.get("text", "") for cell in nb.cells for o in cell.get("outputs", []))
    assert done.returncode == 0, done.stderr[-3000:] + printed[-3000:]
    assert json.loads((gateway_dir / "result.json").read_text()) == {"Succeeded": True}
    assert ended and not (root / "working" / "submission.parquet").exists()  # served; no dry run
    return printed, gateway_dir


def test_kaggle_serve_notebook_answers_the_rerun_gateway(served, tmp_path, monkeypatch):
    """The table's notebook: every fold file serve.py reads is shipped, and nothing else of
    output/; its kernel answers every batch of the rerun's gateway."""
    printed, gateway = serve_notebook(served, served.parent / "data", "test.csv", tmp_path / "root", monkeypatch)
    shipped = {p.name for p in (served / "kaggle" / "weights").iterdir()}
    folds = {f"model_fold{k}.pth" for k in range(3)}
    formats = {"lgbm": ".txt", "xgb": ".ubj", "cat": ".cbm"}
    trees = {f"tree_{m}_fold{k}{ext}" for m, own in formats.items() for k in range(3) for ext in (".json", own)}
    oofs = {f"oof_{m}.csv" for m in ("lgbm", "xgb", "cat", "mlp")}
    assert shipped == {*folds, *trees, *oofs, "config.json", "serve_defaults.json", "dataset-metadata.json"}, shipped
    sub = pd.read_parquet(gateway / "submission.parquet")
    assert len(sub) == len(pd.read_csv(served.parent / "data" / "test.csv")) and sub["target"].between(0, 1).all()
    assert "SERVE: ensemble: mlp 3 fold(s), cat 3 fold(s), lgbm 3 fold(s), xgb 3 fold(s)" in printed, printed[-3000:]
    assert "SERVE: call 1: 25 rows" in printed, printed[-3000:]


DRY_RUN_WARNING = "WARNING: dry-run checkpoints (3 batches of training): fine for a smoke test, not for a score"


def test_every_task_serve_notebook_answers_like_predict_py(served_task, tmp_path, monkeypatch):
    """Each task's --serve notebook on Kaggle: what serve.py reads travels (segmentation's and
    detection's postprocess.json, text's tokenizer; no model folder: a plain fold holds its whole
    model), and the rerun's answers (images read by id from the test folder, texts tokenised per
    batch) are predict.py's submission, row for row: numbers within 1e-5, labels, RLE strings and
    prediction strings equal. (Each task's local run: the test above.)"""
    project, sent, _ = served_task
    root = tmp_path / "root"
    printed, gateway = serve_notebook(project, sent.parent, sent.name, root, monkeypatch, "--competition", "comp")
    shipped, output = project / "kaggle" / "weights", project / "output"
    assert (shipped / "postprocess.json").is_file() == (output / "postprocess.json").is_file()
    if (output / "tokenizer").is_dir():
        assert sorted(p.name for p in (shipped / "tokenizer").iterdir()) == sorted(
            p.name for p in (output / "tokenizer").iterdir()
        )
    assert not (shipped / "base-model").exists()
    warnings = {line for line in printed.splitlines() if "WARNING" in line}
    assert warnings <= {DRY_RUN_WARNING} and "SERVE: ensemble: 2 fold(s)" in printed, printed[-3000:]
    id_col = pd.read_csv(sent, nrows=0).columns[0]
    served = pd.read_parquet(gateway / "submission.parquet").set_index(id_col)
    batch = pd.read_csv(project / "output" / "submission.csv", dtype={id_col: str}, keep_default_na=False)
    assert sorted(served.index) == sorted(batch[id_col])
    batch = batch.set_index(id_col).loc[served.index]
    numbers = served.select_dtypes("number").columns
    assert served.drop(columns=numbers).equals(batch.drop(columns=numbers))
    assert (served[numbers] - batch[numbers]).abs().to_numpy().max(initial=0) < 1e-5


def run_until_killed(client) -> str:
    try:
        client.execute()
    except Exception as e:  # noqa: BLE001 - the kernel is killed while serving: DeadKernelError
        return type(e).__name__
    return "finished"
