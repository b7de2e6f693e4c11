"""One run signature for every artifact (issue 23): what it covers, and each artifact of another
signature left out with a line saying why (or used when named explicitly). In-process, on the
modules of rendered projects; the runs that write the artifacts are in test_run / test_boosters."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest

from conftest import import_project, render


def flags(data_dir, **over) -> argparse.Namespace:
    base = {"data_dir": str(data_dir), "labels_csv": "labels.csv", "folds": 5, "seed": 42, "lr": 1e-3, "model": "a"}
    return argparse.Namespace(**{**base, **over})


def test_the_signature_follows_data_target_and_folds_not_training_settings(project_modules, tmp_path):
    sign = project_modules.artifacts.run_signature
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "labels.csv").write_text("id,breed\na,x\n")
    base = sign(flags(data))
    assert len(base) == 12 and base == sign(flags(data))
    assert sign(flags(data, lr=0.5, model="b")) == base  # the blend mixes models: settings are not in it
    for changed in ({"folds": 4}, {"seed": 7}, {"labels_csv": "other.csv"}):
        assert sign(flags(data, **changed)) != base, changed
    (data / "train" / "img.jpg").write_bytes(b"x")  # another image in the training folder
    assert sign(flags(data)) != base
    (data / "train" / "img.jpg").unlink()
    (data / "labels.csv").write_text("id,breed\na,y\n")  # a row relabelled: the same size, other content
    assert sign(flags(data)) != base
    (data / "labels.csv").write_text("id,breed\na,x\nb,y\n")  # another labels file
    assert sign(flags(data)) != base


def test_best_params_hold_for_a_copy_of_the_data_with_other_file_times(project_modules, tmp_path, digits_dir, capsys):
    """A search's parameters were left out on Kaggle whenever /kaggle/input's files had other
    modification times than the search's copy: the run signature counts them (an edited image must
    retrain a fold). best_params.json is checked by the signature without the times: the same
    files under other times take it; another file, or another size, still does not."""
    import os
    import shutil

    train, artifacts = project_modules.train, project_modules.artifacts
    copy = tmp_path / "copy"
    shutil.copytree(digits_dir, copy, copy_function=shutil.copy)  # the contents, not the times
    for f in (copy / "train").iterdir():
        os.utime(f, (1_000_000_000, 1_000_000_000))
    here, there = train.get_args(["--data-dir", str(digits_dir)]), train.get_args(["--data-dir", str(copy)])
    assert artifacts.run_signature(here) != artifacts.run_signature(there)  # the folds' artifacts: strict
    assert artifacts.params_signature(here) == artifacts.params_signature(there)
    out = tmp_path / "out"
    out.mkdir()
    record = {"signature": artifacts.run_signature(here), "params_signature": artifacts.params_signature(here)}
    (out / "best_params.json").write_text(json.dumps({"params": {"lr": 0.0042}, **record}))
    argv = ["--data-dir", str(copy), "--out-dir", str(out), "--params", "auto"]
    assert train.get_args(argv).lr == 0.0042 and "PARAMS" not in capsys.readouterr().out
    first = sorted((copy / "train").iterdir())[0]
    first.write_bytes(first.read_bytes() + b"x")  # an image one byte longer: other data
    assert train.get_args(argv).lr != 0.0042 and "left out: searched with run signature" in capsys.readouterr().out
    del record["params_signature"]  # a file of the search before: the strict signature, as it was
    (out / "best_params.json").write_text(json.dumps({"params": {"lr": 0.0042}, **record}))
    assert train.get_args(argv).lr != 0.0042
    assert train.get_args(["--data-dir", str(digits_dir), *argv[2:]]).lr == 0.0042


def test_params_auto_leaves_out_a_search_of_another_signature(project_modules, tmp_path, digits_dir, capsys):
    train, artifacts = project_modules.train, project_modules.artifacts
    argv = ["--data-dir", str(digits_dir), "--out-dir", str(tmp_path)]
    mine = artifacts.run_signature(train.get_args(argv))
    best = tmp_path / "best_params.json"
    best.write_text(json.dumps({"params": {"lr": 0.0042}, "signature": mine}))
    assert train.get_args([*argv, "--params", "auto"]).lr == 0.0042  # searched for this run: used
    best.write_text(json.dumps({"params": {"lr": 0.0042}, "signature": "0123456789ab"}))
    capsys.readouterr()
    args = train.get_args([*argv, "--params", "auto"])
    assert args.lr != 0.0042 and args.params == ""
    out = capsys.readouterr().out
    assert f"PARAMS: {best} left out: searched with run signature 0123456789ab, this run is {mine}" in out
    named = train.get_args([*argv, "--params", str(best)])  # named explicitly: used, with a warning
    assert named.lr == 0.0042
    assert f"WARNING: --params {best}: searched with run signature 0123456789ab" in capsys.readouterr().out
    best.write_text(json.dumps({"params": {"lr": 0.0042}}))  # 0.5.0's file: no signature
    assert train.get_args([*argv, "--params", "auto"]).lr != 0.0042
    assert "no run signature (an older kagtpl)" in capsys.readouterr().out
    assert train.get_args([*argv, "--params", str(best)]).lr == 0.0042
    # emptied, cut short or not tune.py's: auto leaves it out and the run trains (it stopped run.py before
    # train.py's preflight, and no submission at all was handed in); a file you name still stops the run
    whole = json.dumps({"params": {"lr": 0.0042}, "signature": mine})
    for text, why in (("", "cannot read it as tune.py's JSON"), (whole[:20], "cannot read it"), ("[1]", "cannot")):
        best.write_text(text)
        args = train.get_args([*argv, "--params", "auto"])
        assert args.lr != 0.0042 and args.params == ""
        said = capsys.readouterr().out
        assert f"PARAMS: {best} left out: {why}" in said and "this run trains with its flags" in said, said
    best.write_text(json.dumps({"params": {"nope": 1}, "signature": mine}))
    assert train.get_args([*argv, "--params", "auto"]).params == ""
    assert f"PARAMS: {best} left out: 'nope' is not a flag of" in capsys.readouterr().out
    with pytest.raises(project_modules.errors.RunError, match="'nope' is not a flag of"):
        train.get_args([*argv, "--params", str(best)])
    best.unlink()
    assert train.get_args([*argv, "--params", "auto"]).params == ""  # none yet: nothing to say


def test_oof_files_of_another_signature_stay_out_of_oof_csv(project_modules, tmp_path, capsys):
    artifacts = project_modules.artifacts
    frame = pd.DataFrame({"id": ["a", "b"], "fold": 0, "target": [0, 1], "p": [0.2, 0.7]})
    artifacts.signed(frame.copy(), "aaaaaaaaaaaa").to_csv(tmp_path / "oof_fold0.csv", index=False)
    artifacts.signed(frame.assign(fold=1), "bbbbbbbbbbbb").to_csv(tmp_path / "oof_fold1.csv", index=False)
    frame.assign(fold=2).to_csv(tmp_path / "oof_fold2.csv", index=False)  # before signatures
    kept = [artifacts.read_signed(tmp_path / f"oof_fold{k}.csv", "aaaaaaaaaaaa") for k in range(3)]
    assert [k is not None for k in kept] == [True, False, False]
    out = capsys.readouterr().out
    assert "OOF: oof_fold1.csv left out: made with run signature bbbbbbbbbbbb, this run is aaaaaaaaaaaa" in out
    assert "OOF: oof_fold2.csv left out: made with no run signature (an older kagtpl)" in out


def test_a_changed_file_in_a_folder_changes_the_signature(project_modules, tmp_path):
    """Issue 47: every mask emptied, with the same names and count, and the rerun said each fold
    `is complete, skipping (resume)`, then predict.py wrote a byte-identical stale submission: a
    folder counted its files. Now each file's size and time count (nested folders too, as
    BirdCLEF's train_audio/<species>/); a copy that keeps the times signs alike."""
    import os
    import shutil

    sign = project_modules.artifacts.run_signature
    data = tmp_path / "data"
    (data / "masks").mkdir(parents=True)
    (data / "train_audio" / "word").mkdir(parents=True)
    (data / "labels.csv").write_text("id,breed\na,x\n")
    for name in ("a.png", "b.png"):
        (data / "masks" / name).write_bytes(b"\x89PNG mask pixels")
    (data / "train_audio" / "word" / "c.ogg").write_bytes(b"OggS sound")
    base = sign(flags(data))
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)  # copy2: the times kept
    assert sign(flags(copy)) == base
    (data / "masks" / "a.png").write_bytes(b"")  # emptied: the same name, the same count
    emptied = sign(flags(data))
    assert emptied != base
    os.utime(copy / "train_audio" / "word" / "c.ogg", (1, 1))  # a nested clip re-recorded at the same size
    assert sign(flags(copy)) != base
    assert emptied != sign(flags(copy))


def test_python_bytecode_the_evaluation_package_writes_into_the_data_folder_is_not_data(project_modules, tmp_path):
    """serve.py imports the competition's kaggle_evaluation package from the data folder, and Python
    writes its bytecode there (kaggle_evaluation/__pycache__/). It changed the run signature: the
    next train.py retrained every complete fold as "other data" (tests/test_serve.py runs it)."""
    sign = project_modules.artifacts.run_signature
    data = tmp_path / "data"
    (data / "kaggle_evaluation" / "core").mkdir(parents=True)
    (data / "train.csv").write_text("id,target\na,1\n")
    (data / "kaggle_evaluation" / "core" / "relay.py").write_text("PORT = 50051\n")
    base = sign(flags(data))
    for folder in (data / "kaggle_evaluation" / "core", data / "kaggle_evaluation", data):
        (folder / "__pycache__").mkdir()
        (folder / "__pycache__" / "relay.cpython-311.pyc").write_bytes(b"\xa7\r\r\n bytecode")
    assert sign(flags(data)) == base
    (data / "kaggle_evaluation" / "core" / "relay.py").write_text("PORT = 8\n")  # the package itself counts
    assert sign(flags(data)) != base


def test_a_signature_that_reads_as_a_number_stays_text(project_modules, tmp_path, capsys):
    """Issue 47: 3226e4661147 was read back as inf, so a text run threw away its own OOF file
    ('made with run signature inf'). About 1 signature in 250 looks like a number."""
    artifacts = project_modules.artifacts
    frame = pd.DataFrame({"id": ["007", "NA"], "fold": 0, "target": [0, 1], "p": [0.2, 0.7]})
    for signature in ("3226e4661147", "000000001234", "12345678e901"):
        artifacts.signed(frame.copy(), signature).to_csv(tmp_path / "oof_fold0.csv", index=False)
        kept = artifacts.read_signed(tmp_path / "oof_fold0.csv", signature)
        assert kept is not None, capsys.readouterr().out
        assert list(kept["id"]) == ["007", "NA"] and kept["signature"].iloc[0] == signature
    # the boosters' OOF files carry it in their "run" column
    pd.DataFrame({"id": ["a"], "run": ["3226e4661147"]}).to_csv(tmp_path / "oof_lgbm_fold0.csv", index=False)
    assert project_modules.readback.read_ours(tmp_path / "oof_lgbm_fold0.csv")["run"].iloc[0] == "3226e4661147"


@pytest.fixture(scope="module")
def blend_module(tmp_path_factory):
    project = render(tmp_path_factory.mktemp("blend") / "p", task="tabular", gpu="cpu", problem="binary")
    return import_project(project, ("blend", "artifacts"))


def test_the_blend_leaves_out_a_member_of_another_signature(blend_module, tmp_path, capsys):
    """An oof_xgb.csv from another feature set joined the blend when only its ids and columns
    were checked; now it is left out (its test predictions too) with a BLEND line."""
    blend, artifacts = blend_module.blend, blend_module.artifacts
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    for name, sig in (("lgbm", "aaaaaaaaaaaa"), ("mlp", "aaaaaaaaaaaa"), ("xgb", "bbbbbbbbbbbb")):
        p1 = np.clip(y * 0.6 + rng.normal(0.2, 0.2, 200), 0, 1)
        oof = pd.DataFrame({"id": [str(i) for i in range(200)], "fold": 0, "target": y, "p_0": 1 - p1, "p_1": p1})
        artifacts.signed(oof, sig).to_csv(tmp_path / f"oof_{name}.csv", index=False)
    members = {n: np.full((5, 2), 0.5) for n in ("lgbm", "mlp", "xgb")}

    def score(yy, p):
        return float(np.mean((p[:, 1] > 0.5) == yy))

    _, used = blend.blend(members, tmp_path, "id", score, True, artifacts.read_targets, "accuracy", "aaaaaaaaaaaa")
    out = capsys.readouterr().out
    assert "xgb" not in used and set(used) <= {"lgbm", "mlp"}
    assert "BLEND: xgb left out: oof_xgb.csv made with run signature bbbbbbbbbbbb, this run is aaaaaaaaaaaa" in out
    assert "BLEND: member xgb" not in out
