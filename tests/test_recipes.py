"""The generated README's recipes, applied as written: each edit the README gives is checked to be
in the README, made to the rendered train.py / predict.py, and the project then trains and
submits. Changing the loss or the model touches only train.py and predict.py, never the engine."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import render, run_script
from kagtpl import table

pytestmark = pytest.mark.slow
CPU = ["--device", "cpu"]


def apply(project, readme: str, path: str, old: str, new: str, documented: str | None = None) -> None:
    """Replace `old` by `new` in a project file; the README must show the edit (`documented`, or `new`)."""
    for line in (documented or new).strip().splitlines():
        assert line.strip() in readme, f"the README does not give: {line.strip()}"
    text = (project / path).read_text()
    assert old in text, f"{path} no longer has: {old}"
    (project / path).write_text(text.replace(old, new, 1))


def test_multi_label_images_with_bce(tmp_path, digits_dir):
    data = tmp_path / "data"
    shutil.copytree(digits_dir, data)
    labels = pd.read_csv(data / "labels.csv", dtype=str)
    digits = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    labels["breed"] = [f"{d} {'even' if digits.index(d) % 2 == 0 else 'odd'}" for d in labels["breed"]]
    labels.to_csv(data / "labels.csv", index=False)
    sample = pd.read_csv(data / "sample_submission.csv", dtype={"id": str})[["id"]]
    sample[digits + ["even", "odd"]] = 0.5
    sample.to_csv(data / "sample_submission.csv", index=False)
    project = render(tmp_path / "proj", data_dir=str(data))
    readme = (project / "README.md").read_text()

    check = """    for i, (image_id, label) in enumerate(zip(train[args.id_col], train[label_col], strict=True)):
        if label not in classes:
            raise errors.DataError(
                f"{labels_path} line {i + 2} (id {image_id}): label {label!r} is not a class of {sample_path.name}"
            )
"""
    tags = """    tags = train[label_col].fillna("").str.split()
    for i, row_tags in enumerate(tags):
        if unknown := set(row_tags) - set(classes):
            raise errors.DataError(
                f"{labels_path} line {i + 2}: tag {sorted(unknown)[0]!r} is not a column of {sample_path.name}"
            )
"""
    apply(project, readme, "train.py", check, tags)
    target = '    train["target"] = train[label_col].map({c: k for k, c in enumerate(classes)})\n'
    multi_hot = '    train["target"] = [np.isin(classes, t).astype(np.float32) for t in tags]\n'
    apply(project, readme, "train.py", target, multi_hot)
    counts = (
        "    counts = train[label_col].value_counts().to_dict()  # images per class: every fold needs some\n"
        "    engine.check_folds(args.folds, labels_path, len(train), counts)\n"
    )
    rows_only = "    engine.check_folds(args.folds, labels_path, len(train))\n"
    apply(project, readme, "train.py", counts, rows_only)
    apply(
        project,
        readme,
        "train.py",
        "    return torch.nn.functional.cross_entropy(logits, y)",
        "    return torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())",
    )
    apply(
        project,
        readme,
        "train.py",
        "        total = total + (out * scale[1] + scale[0] if scale else out.softmax(1))",
        "        total = total + (out * scale[1] + scale[0] if scale else out.sigmoid())",
        documented="out.sigmoid()",
    )
    score_old = """    p = np.clip(probs, 1e-15, 1 - 1e-15)
    logloss = log_loss(y, p / p.sum(1, keepdims=True), labels=range(n_classes))
    scores = {"logloss": logloss, "Acc": accuracy_score(y, probs.argmax(1))}"""
    score_new = """    p = np.clip(probs, 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    scores = {"logloss": logloss, "Acc": float(((probs > 0.5) == y).mean())}"""
    apply(project, readme, "train.py", score_old, score_new)
    apply(
        project,
        readme,
        "train.py",
        "    split = KFold if comp.scale else StratifiedKFold  # a score has no classes to stratify by",
        "    split = KFold",
        documented="`split = KFold`",
    )
    apply(project, readme, "train.py", 'splits.split(comp.train, comp.train["target"])', "splits.split(comp.train)")
    apply(
        project,
        readme,
        "predict.py",
        'probs, used = submission.ensemble(all_probs, sample[id_col], normalize=kind != "number")',
        "probs, used = submission.ensemble(all_probs, sample[id_col], normalize=False)",
        documented="`normalize=False` in `submission.ensemble(...)`",
    )
    apply(
        project,
        readme,
        "predict.py",
        "submission.write_submission(sub, sample, SUBMISSIONS[kind],",
        'submission.write_submission(sub, sample, "probability",',
        documented='`"probability"` for `SUBMISSIONS[kind]` in `submission.write_submission(...)`',
    )

    log = run_script(project, "train.py", *CPU, "--epochs", "2", "--folds", "2").stdout
    assert "OOF: Acc=" in log and "Epoch 2:" in log
    oof = pd.read_csv(project / "output" / "oof.csv")
    assert [f"target_{j}" for j in range(12)] == [c for c in oof.columns if c.startswith("target")]
    assert set(oof[[f"target_{j}" for j in range(12)]].sum(axis=1)) == {2.0}  # a digit and a parity per row
    run_script(project, "predict.py", *CPU)
    sub = pd.read_csv(project / "output" / "submission.csv", dtype={"id": str})
    probs = sub[digits + ["even", "odd"]].to_numpy()
    assert ((probs >= 0) & (probs <= 1)).all() and list(sub["id"]) == list(sample["id"])
    assert not np.allclose(probs.sum(1), 1.0)  # independent tags, not one distribution


def test_custom_model_for_a_table(tmp_path):
    data = table.write_table(tmp_path / "data", "regression")
    project = render(
        tmp_path / "proj",
        task="tabular",
        data_dir=str(data),
        train_csv="train.csv",
        test_csv="test.csv",
        id_col="row_id",
        target="target",
        problem="regression",
        metric="rmse",
    )
    readme = (project / "README.md").read_text()
    start, end = readme.index("class ResidualMLP"), readme.index("```", readme.index("class ResidualMLP"))
    model_code = readme[start:end]
    apply(project, readme, "train.py", "def build_model(", model_code + "\n\ndef build_model(", model_code)
    apply(
        project,
        readme,
        "train.py",
        '    return TabularMLP(len(pre.state["num"]), pre.cardinalities, n_out, hidden, config["dropout"], y_mean, y_std)',  # noqa: E501
        '    return ResidualMLP(len(pre.state["num"]), pre.cardinalities, n_out, hidden[0], config["dropout"], y_mean, y_std)',  # noqa: E501
    )
    log = run_script(project, "train.py", *CPU, "--epochs", "3").stdout
    assert "OOF: rmse=" in log
    ckpt = torch.load(project / "output" / "model_fold0.pth", weights_only=True)
    assert "stem.weight" in ckpt["model"] and "block.3.weight" in ckpt["model"]
    run_script(project, "predict.py", *CPU)
    sub = pd.read_csv(project / "output" / "submission.csv")
    assert len(sub) == len(pd.read_csv(data / "test.csv")) and np.isfinite(sub["target"]).all()
