"""--task tabular: detection at generation time, render-and-run of every target layout on CPU,
preflight errors, and the OOF score against a simple scikit-learn baseline on the same folds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import ROOT, RUN_ENV, free_port, import_project, render, run_script
from kagtpl import table

pytestmark = pytest.mark.slow

DETECTED = {
    "binary": ("target", "binary", "probs", "auc", "sample_submission.csv"),
    "binary-label": ("target", "binary", "label", "accuracy", "gender_submission.csv"),
    "multiclass": ("label", "multiclass", "probs", "logloss", "sample_submission.csv"),
    "multiclass-label": ("target", "multiclass", "label", "accuracy", "sample_submission.csv"),
    "regression": ("target", "regression", "label", "rmse", "sample_submission.csv"),
}


def new_tabular(tmp_path, kind, *flags):
    data = table.write_table(tmp_path / "data", kind)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kagtpl",
            "new",
            "comp",
            "--task",
            "tabular",
            "--gpu",
            "cpu",
            "--data",
            str(data),
            "--folds",
            "3",
            "--epochs",
            "30",
            *flags,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return tmp_path / "comp", data


@pytest.mark.parametrize("kind", list(DETECTED))
def test_tabular_layout_trains_and_submits(tmp_path, kind):
    project, data = new_tabular(tmp_path, kind)
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    target, problem, submission, metric, sample_name = DETECTED[kind]
    assert (answers["target"], answers["problem"], answers["submission"], answers["metric"]) == (
        target,
        problem,
        submission,
        metric,
    )
    assert answers["sample_submission"] == sample_name and answers["task"] == "tabular"

    # 300 trees, not 2,000: the layout is the subject (the boosters' own tests: test_boosters.py); CatBoost's
    # multiclass ran to all 2,000 in one fold, 11 s of this test's 17
    log = run_script(project, "train.py", "--device", "cpu", "--booster-rounds", "300").stdout
    assert "RESOURCES: " in log and "GPU=none, Mixed Precision=OFF" in log
    assert "DataLoader: num_workers=0, prefetch_factor=None, persistent_workers=False (in-memory batching" in log
    assert re.search(r"^Model: mlp \([\d.]+M params, small model\)$", log, re.M)
    assert re.search(rf"^Epoch 1: Loss=[\d.]+, ValLoss=[\d.]+, {metric.upper()}=[\d.]+, .* GPU=none$", log, re.M)
    assert re.search(rf"^OOF: {metric}=[\d.]+ over \d+ rows from folds \[0, 1, 2\] \(mlp\)$", log, re.M), log[-2000:]
    pred = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "ENSEMBLE: 3 checkpoint(s), folds [0, 1, 2]" in pred

    sub = pd.read_csv(project / "output" / "submission.csv")
    sample = pd.read_csv(data / sample_name)
    assert list(sub.columns) == list(sample.columns)
    assert sub.iloc[:, 0].astype(str).tolist() == sample.iloc[:, 0].astype(str).tolist()
    values = sub.iloc[:, 1:]
    if submission == "probs":
        assert ((values >= 0) & (values <= 1)).all().all()
        if values.shape[1] > 1:
            np.testing.assert_allclose(values.sum(axis=1), 1.0, atol=1e-6)
    solution = pd.read_csv(tmp_path / "data_solution.csv")
    truth = solution.iloc[:, 1]
    if kind == "binary-label" or kind == "multiclass-label":
        assert set(values.iloc[:, 0].astype(str)) <= set(truth.astype(str)) | set(
            pd.read_csv(data / "train.csv")[target].astype(str)
        )
        assert (values.iloc[:, 0].astype(str).to_numpy() == truth.astype(str).to_numpy()).mean() > 0.8
    elif kind == "regression":
        assert np.sqrt(np.mean((values.iloc[:, 0] - truth) ** 2)) < truth.std()  # beats predicting the mean


def _baseline_oof(train, target, folds_of, problem):
    """A simple scikit-learn baseline on the project's own folds: impute + scale + one-hot, then a
    logistic regression (classes) or ridge (regression)."""
    from sklearn.compose import make_column_transformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    x = train.drop(columns=[train.columns[0], target])
    num = [c for c in x.columns if pd.api.types.is_numeric_dtype(x[c])]
    cat = [c for c in x.columns if c not in num]
    pre = make_column_transformer(
        (make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), num),
        (
            make_pipeline(
                SimpleImputer(strategy="constant", fill_value="missing"), OneHotEncoder(handle_unknown="ignore")
            ),
            cat,
        ),
    )
    model = make_pipeline(pre, Ridge() if problem == "regression" else LogisticRegression(max_iter=2000))
    pred = np.zeros(len(train))
    for fold in sorted(set(folds_of)):
        trn, val = folds_of != fold, folds_of == fold
        model.fit(x[trn], train[target][trn])
        pred[val] = model.predict(x[val]) if problem == "regression" else model.predict_proba(x[val])[:, 1]
    return pred


@pytest.mark.parametrize("kind,metric", [("binary", "auc"), ("regression", "rmse")])
def test_oof_score_is_competitive_with_a_sklearn_baseline(tmp_path, kind, metric):
    from sklearn.metrics import mean_squared_error, roc_auc_score

    project, data = new_tabular(tmp_path, kind, "--folds", "5")
    log = run_script(project, "train.py", "--device", "cpu").stdout
    ours = float(
        re.search(rf"^OOF: {metric}=([\d.]+) over \d+ rows from folds \[[\d, ]+\] \(mlp\)$", log, re.M).group(1)
    )
    oof = pd.read_csv(project / "output" / "oof.csv")
    train = pd.read_csv(data / "train.csv")
    train["row_id"] = train["row_id"].astype(str)
    folds_of = train["row_id"].map(dict(zip(oof["row_id"].astype(str), oof["fold"], strict=True))).to_numpy()
    base = _baseline_oof(train, "target", folds_of, "regression" if kind == "regression" else "binary")
    if kind == "regression":
        baseline = float(np.sqrt(mean_squared_error(train["target"], base)))
        print(f"tabular OOF rmse: ours {ours:.4f}, ridge baseline {baseline:.4f}")
        assert ours <= 1.10 * baseline
    else:
        baseline = roc_auc_score(train["target"], base)
        print(f"tabular OOF auc: ours {ours:.4f}, logistic-regression baseline {baseline:.4f}")
        assert ours >= baseline - 0.02


def _break(data, how):
    train, test = pd.read_csv(data / "train.csv"), pd.read_csv(data / "test.csv")
    sample = pd.read_csv(data / "sample_submission.csv")
    if how == "no_target":
        train = train.drop(columns=["target"])
    elif how == "all_nan":
        train["mean_radius"] = np.nan
    elif how == "test_missing_column":
        test = test.drop(columns=["site"])
    elif how == "test_extra_column":
        test["leak"] = 1
    elif how == "unknown_id":
        sample.loc[3, "row_id"] = "r-nope"
    train.to_csv(data / "train.csv", index=False)
    test.to_csv(data / "test.csv", index=False)
    sample.to_csv(data / "sample_submission.csv", index=False)


@pytest.mark.parametrize(
    "how,message",
    [
        ("no_target", r"train\.csv: target column 'target' missing"),
        ("test_missing_column", r"test\.csv: column 'site' of train\.csv is missing"),
        ("test_extra_column", r"test\.csv: column 'leak' is not a column of train\.csv"),
        ("unknown_id", r"sample_submission\.csv line 5: id 'r-nope' is not in test\.csv"),
    ],
)
def test_tabular_preflight_names_the_column(tmp_path, how, message):
    project, data = new_tabular(tmp_path, "binary")
    _break(data, how)
    r = run_script(project, "train.py", "--device", "cpu", "--dry-run", check=False)
    assert r.returncode == 1 and re.search("PREFLIGHT ERROR: .*" + message, r.stderr), r.stderr
    assert "Epoch" not in r.stdout


def test_a_column_empty_in_every_training_row_is_dropped_not_an_error(tmp_path):
    """A column with no value in train.csv (a join's leftover) was a preflight error: under run.py
    with nobody watching, the whole run handed in no submission. It carries nothing to learn: it is
    dropped with a line, as an id-like column is, and the run trains on the other columns."""
    project, data = new_tabular(tmp_path, "binary")
    _break(data, "all_nan")
    r = run_script(project, "train.py", "--device", "cpu", "--dry-run", check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "DROP: column 'mean_radius': empty in every row of train.csv (nothing to learn from)" in r.stdout
    columns = len(pd.read_csv(data / "train.csv").columns) - 2  # less the id and the target
    assert re.search(rf"^DATA: \d+ train rows, {columns - 1} features,", r.stdout, re.M), r.stdout[-3000:]


def test_unseen_categories_and_partial_folds(tmp_path):
    """Test rows whose category train.csv never has: a WARNING names the column and values, and
    every model reads them as a missing value (the same submission as with those cells empty).
    The MLP's code 0 (missing or unseen) starts at zero: in a column with no missing value in
    training nothing trains it, and a random row gave unseen values an arbitrary push."""
    project, data = new_tabular(tmp_path, "binary")
    test = pd.read_csv(data / "test.csv")
    test.loc[:5, "grade"] = "never-seen-in-train"  # grade has missing values in train.csv, site none
    test.loc[:3, "site"] = "atlantis"
    test.to_csv(data / "test.csv", index=False)
    log = run_script(project, "train.py", "--device", "cpu", "--epochs", "3").stdout
    n = len(test)
    for column, rows, value in (("grade", 6, "never-seen-in-train"), ("site", 4, "atlantis")):
        said = f"WARNING: test.csv column {column!r}: {rows} of {n} rows hold values train.csv never has ({value!r}); "
        assert said + "every model reads them as a missing value" in log, log[:3000]
    out = project / "output"
    ckpt = torch.load(out / "model_fold0.pth", map_location="cpu", weights_only=True)
    site, grade = (ckpt["preprocessor"]["cat"].index(c) for c in ("site", "grade"))
    assert not ckpt["model"][f"embeddings.{site}.weight"][0].any()  # never trained: still the zero it started at
    assert ckpt["model"][f"embeddings.{grade}.weight"][0].any()  # trained on the missing grades

    for path in out.glob("test_*_fold*.csv"):  # the trees' fold models run on the rows, as on a hidden test set
        path.unlink()
    run_script(project, "predict.py", "--device", "cpu", "--submission", "unseen.csv")
    empty = data.parent / "empty"
    shutil.copytree(data, empty)
    test.loc[:5, "grade"], test.loc[:3, "site"] = np.nan, np.nan
    test.to_csv(empty / "test.csv", index=False)
    run_script(project, "predict.py", "--device", "cpu", "--data-dir", str(empty), "--submission", "empty.csv")
    unseen, missing = (pd.read_csv(out / name) for name in ("unseen.csv", "empty.csv"))
    assert np.allclose(unseen["target"], missing["target"], rtol=0, atol=1e-6)

    (out / "model_fold1.pth").unlink()
    (out / "model_fold2.pth").write_bytes(b"corrupt")
    pred = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "ENSEMBLE: 1 checkpoint(s), folds [0]" in pred and "WARNING: skipping" in pred
    sub = pd.read_csv(out / "submission.csv")
    assert sub["target"].between(0, 1).all() and len(sub) == len(test)


def test_a_rerun_with_another_lr_trains_it_and_one_on_another_batch_resumes(tmp_path):
    """A rerun with another --lr in the same folder skipped all the folds as complete: the new LR
    never trained, and the experiments table gave it the old folds' CV. The training flags are now
    resume keys (artifacts.TRAINING_FLAGS, the task's resume_keys), compared as given: the LR used
    follows the batch, so a rerun on another batch (another card's probe) still resumes."""
    project, _ = new_tabular(tmp_path, "binary")
    mlp = ["train.py", "--device", "cpu", "--models", "mlp", "--epochs", "3"]
    run_script(project, *mlp)
    out = project / "output"
    first = {p.name: p.read_bytes() for p in out.glob("model_fold*.pth")}
    shutil.copy2(out / "model_fold1.pth", tmp_path / "model_fold1.pth")  # its time kept: older than the rerun's

    again = run_script(project, *mlp, "--batch-size", "32").stdout
    assert again.count("is complete, skipping (resume)") == 3 and "retrained" not in again, again[-2000:]
    assert {p.name: p.read_bytes() for p in out.glob("model_fold*.pth")} == first

    lr = run_script(project, *mlp, "--lr", "0.01").stdout
    for k in range(3):
        assert f"FOLD: model_fold{k}.pth was trained with other settings (lr=0.003, this run 0.01): retrained" in lr
        assert f"FOLD {k} DONE" in lr
    rows = pd.read_csv(out / "experiments.csv", dtype=str).to_dict("records")
    assert [r["epochs_done"] == "0 0 0" for r in rows] == [False, True, False], rows  # the resumed run's row says so

    shutil.copy2(tmp_path / "model_fold1.pth", out / "model_fold1.pth")  # a fold left over from the 0.003 run
    pred = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "ENSEMBLE: 2 checkpoint(s), folds [0, 2]" in pred, pred
    said = "skipping output/model_fold1.pth: trained with another configuration than the newest checkpoint"
    assert f"{said} (lr=0.003, newest 0.01)" in pred, pred


def _seasonal_sales(data, rng, train_rows=900, test_rows=300):
    """Daily sales of a shop: a season by month, a weekend lift and one numeric feature. The test
    rows are the next year's (a time split, as a forecasting competition's): every test date is one
    train.csv never has, while its months and weekdays repeat. Returns the held-out answers."""

    def rows(n, years, first):
        day = pd.to_datetime([f"{y}-01-01" for y in years]) + pd.to_timedelta(rng.integers(0, 365, n), unit="D")
        x = rng.normal(size=n)
        y = 5 * np.sin(2 * np.pi * (day.month - 1) / 12) + 2 * (day.day_of_week >= 5) + x + rng.normal(0, 0.5, n)
        return pd.DataFrame({"id": np.arange(first, first + n), "day": day.strftime("%Y-%m-%d"), "x": x}), y

    data.mkdir()
    train, y = rows(train_rows, rng.choice([2021, 2022, 2023], train_rows), 0)
    train["sales"] = y
    train.to_csv(data / "train.csv", index=False)
    test, answers = rows(test_rows, [2024] * test_rows, train_rows)
    test.to_csv(data / "test.csv", index=False)
    pd.DataFrame({"id": test["id"], "sales": 0.0}).to_csv(data / "sample_submission.csv", index=False)
    return pd.Series(answers, index=test["id"])


def test_dates_become_numbers_a_later_year_is_predicted_and_a_feature_added_in_train_py_reaches_predict(tmp_path):
    """An ISO date column (--dates auto) is split into numbers by train.py's add_features, which
    predict.py and serve.py apply too. As text it was a category per day, dropped as id-like (or,
    with fewer days, memorised): the next year's test rows, all unseen dates, got no season at all.
    A feature the user adds in add_features reaches predict.py's rows with no other edit."""
    from sklearn.metrics import mean_squared_error

    answers = _seasonal_sales(tmp_path / "data", np.random.default_rng(0))
    project = render(
        tmp_path / "comp", task="tabular", data_dir=str(tmp_path / "data"), id_col="id", target="sales",
        problem="regression", metric="rmse", submission="label", folds=3, epochs=30,
    )  # fmt: skip
    script = project / "train.py"
    source = script.read_text()
    assert source.count("    df = df.copy()\n") == 1
    script.write_text(source.replace("    df = df.copy()\n", '    df = df.copy()\n    df["x_cubed"] = df["x"] ** 3\n'))

    held_out = {}
    for dates in ("auto", ""):
        out = f"output-{dates or 'text'}"
        flags = ("--device", "cpu", "--models", "lgbm,mlp", "--dates", dates, "--out-dir", out)
        log = run_script(project, "train.py", *flags).stdout
        run_script(project, "predict.py", "--device", "cpu", "--out-dir", out)
        sub = pd.read_csv(project / out / "submission.csv").set_index("id")
        held_out[dates] = float(np.sqrt(mean_squared_error(answers, sub.loc[answers.index, "sales"])))
        config = json.loads((project / out / "config.json").read_text())["config"]
        if dates == "auto":
            made = "day_year, day_month, day_day, day_day_of_week, day_days"
            assert f"DATES: day -> {made} (auto: every value an ISO date; --dates '' keeps them text)" in log
            assert "FEATURES: 7 numeric, 0 categories" in log and config["date_columns"] == "day", log[:3000]
        else:
            assert "DATES:" not in log and "DROP: column 'day'" in log and "FEATURES: 2 numeric" in log, log[:3000]
            assert config["date_columns"] == ""
    print(f"held-out RMSE of the next year: dates as numbers {held_out['auto']:.3f}, as text {held_out['']:.3f}")
    assert held_out["auto"] < 0.5 * held_out[""], held_out

    test = pd.read_csv(tmp_path / "data" / "test.csv")
    test.loc[4, "day"] = "2024-02-30"
    test.to_csv(tmp_path / "data" / "test.csv", index=False)
    r = run_script(project, "train.py", "--device", "cpu", "--dry-run", check=False)
    said = "test.csv line 6, column 'day': '2024-02-30' is not a date"
    assert r.returncode == 1 and said in r.stderr and "Epoch" not in r.stdout, r.stderr
    r = run_script(project, "train.py", "--device", "cpu", "--dry-run", "--dates", "shop", check=False)
    assert r.returncode == 1 and "PREFLIGHT ERROR: --dates shop: not a feature column of" in r.stderr, r.stderr


def test_class_columns_named_target_underscore_class_train_and_submit(tmp_path):
    """Cirrhosis (Playground S3E26): train.csv's Status holds C, CL and D; the sample's columns are
    Status_C, Status_CL and Status_D. kagtpl new detected it, then train.py's preflight stopped:
    "target 'C' is not a column of sample_submission.csv". Each column now stands for the label
    after `Status_`: the fallback is each label's share in its own column, and the folds learn."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    n, m = 450, 90
    x = rng.normal(size=n + m)
    status = np.where(x[:n] > 0.6, "D", np.where(x[:n] < -1.0, "CL", "C"))
    frame = pd.DataFrame({"id": np.arange(n + m), "Bilirubin": x + rng.normal(0, 0.3, n + m), "Drug": "P"})
    frame.iloc[:n].assign(Status=status).to_csv(data / "train.csv", index=False)
    frame.iloc[n:].to_csv(data / "test.csv", index=False)
    columns = {"Status_C": 0.6, "Status_CL": 0.1, "Status_D": 0.3}
    pd.DataFrame({"id": frame["id"].iloc[n:], **columns}).to_csv(data / "sample_submission.csv", index=False)
    r = subprocess.run(
        [sys.executable, "-m", "kagtpl", "new", "cirrhosis", "--task", "tabular", "--gpu", "cpu", "--data", str(data),
         "--folds", "3", "--epochs", "20"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and "problem: multiclass, classes 3 (C, CL, D); metric logloss" in r.stdout, r.stderr
    project = tmp_path / "cirrhosis"

    log = run_script(project, "train.py", "--device", "cpu", "--models", "lgbm,mlp").stdout
    out = project / "output"
    shares = pd.Series(status).value_counts(normalize=True)
    fallback = pd.read_csv(out / "submission.csv")  # train.py's, until predict.py: each label's share in its column
    assert np.allclose(fallback[list(columns)].iloc[0], [shares["C"], shares["CL"], shares["D"]]), fallback.iloc[0]
    oof = pd.read_csv(out / "oof.csv")
    assert list(oof.filter(like="p_").columns) == ["p_Status_C", "p_Status_CL", "p_Status_D"]
    truth = np.array([list(columns).index(f"Status_{s}") for s in status])[oof["id"].to_numpy()]
    assert (oof["target"].to_numpy() == truth).all()  # C is column 0, CL 1, D 2
    loss = float(re.search(r"^OOF: logloss=([\d.]+) over 450 rows .*\(mlp\)$", log, re.M).group(1))
    prior = -float(np.mean(np.log(shares[status].to_numpy())))
    assert loss < 0.8 * prior, (loss, prior)  # the folds learn Bilirubin's classes

    run_script(project, "predict.py", "--device", "cpu")
    sub = pd.read_csv(out / "submission.csv")
    assert list(sub.columns) == ["id", *columns] and len(sub) == m
    assert np.allclose(sub[list(columns)].sum(axis=1), 1.0, atol=1e-6)
    high = sub.loc[frame["Bilirubin"].iloc[n:].to_numpy() > 1.5]  # the test rows most like D
    assert (high[list(columns)].idxmax(axis=1) == "Status_D").mean() > 0.8, high


def _regression_project(tmp_path, features: pd.DataFrame, target: str, y, n: int, metric: str, epochs: int,
                        placeholder=0.0):  # fmt: skip
    """A regression table rendered for `metric`: `features`' first n rows with `target` (y) in
    train.csv, the rest the test rows (ids 0..), a sample of `placeholder`; 3 folds."""
    data = tmp_path / "data"
    data.mkdir()
    frame = features.assign(id=np.arange(len(features)))
    frame.iloc[:n].assign(**{target: y[:n]}).to_csv(data / "train.csv", index=False)
    frame.iloc[n:].to_csv(data / "test.csv", index=False)
    pd.DataFrame({"id": frame["id"].iloc[n:], target: placeholder}).to_csv(data / "sample_submission.csv", index=False)
    return render(
        tmp_path / "comp", task="tabular", data_dir=str(data), id_col="id", target=target, problem="regression",
        metric=metric, submission="label", folds=3, epochs=epochs,
    )  # fmt: skip


def test_metric_mae_fits_the_absolute_error_and_beats_squared_error_training_on_heavy_tails(tmp_path):
    """--metric mae (Playground's crab age, MAE): the boosters fit L1 (LightGBM's l1, XGBoost's
    reg:absoluteerror, CatBoost's MAE), the MLP an L1 loss, early stopping watches the absolute
    error. Trained for squared error (all a table could do before: rmse), the outliers of a
    heavy-tailed target pull every model toward them, and the held-out MAE is far worse."""
    rng, n, m = np.random.default_rng(0), 900, 300
    x = rng.normal(size=(n + m, 3))
    y = 3 * x[:, 0] + x[:, 1] - x[:, 2] ** 2 + rng.standard_t(1.2, n + m)  # Student's t: a few huge errors
    project = _regression_project(tmp_path, pd.DataFrame(x, columns=["a", "b", "c"]), "y", y, n, "mae", epochs=20)
    held_out = {}
    for metric in ("mae", "rmse"):
        out = f"output-{metric}"
        flags = ("--device", "cpu", "--models", "lgbm,mlp", "--metric", metric, "--out-dir", out)
        log = run_script(project, "train.py", *flags).stdout
        assert re.search(rf"^OOF: {metric}=[\d.]+ over {n} rows from folds \[0, 1, 2\] \(lgbm\)$", log, re.M), log
        run_script(project, "predict.py", "--device", "cpu", "--out-dir", out)
        sub = pd.read_csv(project / out / "submission.csv")
        held_out[metric] = float(np.mean(np.abs(sub["y"].to_numpy() - y[n:])))
    print(f"held-out MAE: trained for mae {held_out['mae']:.3f}, for rmse {held_out['rmse']:.3f}")
    assert held_out["mae"] < 0.8 * held_out["rmse"], held_out


def test_metric_qwk_hands_in_whole_labels_in_the_training_range(tmp_path):
    """--metric qwk (wine quality, the Child Mind Institute's sii): a regression on whole labels,
    scored by quadratic weighted kappa. The OOF score rounded the predictions into the labels'
    range, but the submission held the regression's floats (3.27): Kaggle's kappa scorer refuses
    a float column. Now train.py's fallback, predict.py and serve.py write whole labels, clipped
    into the training labels' range (config.json's target_range), predict.py's cut where the blend's
    OOF rows score the best kappa."""
    rng, n, m = np.random.default_rng(0), 400, 80
    x = rng.normal(size=(n + m, 2))
    quality = np.clip(np.rint(5 + 1.2 * x[:, 0] + rng.normal(0, 0.5, n + m)), 3, 8).astype(int)
    frame = pd.DataFrame(x, columns=["acidity", "sugar"])
    project = _regression_project(tmp_path, frame, "quality", quality, n, "qwk", epochs=10, placeholder=5)
    log = run_script(project, "train.py", "--device", "cpu", "--models", "lgbm,mlp").stdout
    fallback = pd.read_csv(project / "output" / "submission.csv")["quality"]  # train.py's, until predict.py
    assert "is a fallback (the rounded training mean for every row)" in log, log[:3000]
    assert fallback.dtype == np.int64 and set(fallback) == {round(quality[:n].mean())}, fallback.head()
    oof = float(re.search(r"^OOF: qwk=([\d.]+) over 400 rows .*\(lgbm\)$", log, re.M).group(1))
    assert oof > 0.5, log[-3000:]  # the acidity is learnt
    said = run_script(project, "predict.py", "--device", "cpu").stdout
    # the grades cut where the blend's OOF rows score best (grades.with_cuts), not at the halves
    cuts = re.search(r"^CUTS: quality's grades 3-8 cut at \[(.*)\]: OOF QWK ([\d.]+) over 400 rows, chosen on them "
                     r"\(rounded at the halves: ([\d.]+)\)$", said, re.M)  # fmt: skip
    assert cuts and float(cuts[2]) >= float(cuts[3]) and len(cuts[1].split(", ")) == 5, said[-3000:]
    sub = pd.read_csv(project / "output" / "submission.csv")["quality"]
    assert sub.dtype == np.int64 and sub.between(quality[:n].min(), quality[:n].max()).all() and sub.nunique() > 2
    config = json.loads((project / "output" / "config.json").read_text())["config"]
    assert config["target_range"] == [[float(quality[:n].min())], [float(quality[:n].max())]]


def test_digit_recognizers_layout_numbers_the_rows_and_fills_the_samples_label(tmp_path):
    """Digit Recognizer as Kaggle ships it (sklearn's 8x8 digits here): train.csv `label,pixel0..`,
    test.csv only pixels, sample `ImageId,Label` with ImageId 1..n. kagtpl new stopped at "no id
    column 'ImageId'"; now train.py and predict.py number the rows, and the labels land in the
    sample's Label, in its order, far above chance (10 classes: 0.1)."""
    from sklearn.datasets import load_digits

    from kagtpl.new import NewAnswers, new_project

    digits, n = load_digits(), 1200
    pixels = pd.DataFrame(digits.data.astype(int), columns=[f"pixel{i}" for i in range(64)])
    data = tmp_path / "data"
    data.mkdir()
    pixels.iloc[:n].assign(label=digits.target[:n]).to_csv(data / "train.csv", index=False)
    pixels.iloc[n:].to_csv(data / "test.csv", index=False)
    ids = np.arange(1, len(pixels) - n + 1)
    pd.DataFrame({"ImageId": ids, "Label": 0}).to_csv(data / "sample_submission.csv", index=False)
    new_project(NewAnswers(name="digits", task="tabular", gpu="cpu", data=data, dest=tmp_path, folds=3, epochs=5))
    project = tmp_path / "digits"
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["row_ids"] == "1"
    run_script(project, "train.py", "--device", "cpu", "--models", "lgbm,mlp")
    run_script(project, "predict.py", "--device", "cpu")
    sub = pd.read_csv(project / "output" / "submission.csv")
    assert list(sub.columns) == ["ImageId", "Label"] and sub["ImageId"].tolist() == ids.tolist()
    assert (sub["Label"].to_numpy() == digits.target[n:]).mean() > 0.8
    oof = pd.read_csv(project / "output" / "oof.csv")
    assert sorted(oof["ImageId"].astype(int)) == list(range(1, n + 1))


def _fertilizers(data, n: int = 900, m: int = 300, seed: int = 0) -> pd.Series:
    """Playground S5E6's layout (Predicting Optimal Fertilizers): soil, crop and nutrients, seven
    fertilizer names; the sample holds three names a row, space-separated (MAP@3). Returns the
    test rows' true names."""
    rng = np.random.default_rng(seed)
    names = ["14-35-14", "10-26-26", "17-17-17", "28-28", "20-20", "DAP", "Urea"]
    soil, crop = rng.choice(["Sandy", "Loamy", "Red"], n + m), rng.choice(["Maize", "Paddy", "Wheat"], n + m)
    nutrients = rng.integers(0, 43, (n + m, 3))
    logits = np.column_stack([0.08 * nutrients, (soil == "Red") * 1.0, (crop == "Paddy") * 1.2, rng.normal(size=n + m)])
    logits = np.column_stack([logits, 0.04 * nutrients.sum(1)]) + rng.normal(0, 1.2, (n + m, 7))
    frame = pd.DataFrame({"id": np.arange(n + m), "Soil Type": soil, "Crop Type": crop})
    frame[["Nitrogen", "Potassium", "Phosphorous"]] = nutrients
    frame["Fertilizer Name"] = np.array(names)[logits.argmax(1)]
    data.mkdir()
    frame.iloc[:n].to_csv(data / "train.csv", index=False)
    frame.iloc[n:].drop(columns="Fertilizer Name").to_csv(data / "test.csv", index=False)
    pd.DataFrame({"id": frame["id"].iloc[n:], "Fertilizer Name": "14-35-14 10-26-26 Urea"}).to_csv(
        data / "sample_submission.csv", index=False
    )
    return frame["Fertilizer Name"].iloc[n:].reset_index(drop=True)


def _map3(handed_in, truth) -> float:
    return float(
        np.mean(
            [
                next((1 / (i + 1) for i, c in enumerate(s.split()) if c == t), 0.0)
                for s, t in zip(handed_in, truth, strict=True)
            ]
        )
    )


def test_a_sample_of_three_labels_a_row_is_map3_and_hands_in_the_three_likeliest(tmp_path):
    """MAP@3 (Playground S5E6, fertilizers): kagtpl read the sample's `14-35-14 10-26-26 Urea` as a
    label and handed in one name a row, scored by accuracy. Now --metric map3 is detected: every
    OOF line scores MAP@3, the fallback is the three most common names, and predict.py hands in
    each row's three likeliest, most likely first; a name that is not a class fails the check."""
    from kagtpl.new import NewAnswers, new_project

    data = tmp_path / "data"
    truth = _fertilizers(data)
    shutil.copytree(ROOT / "tests" / "standin" / "kaggle_evaluation", data / "kaggle_evaluation")  # serve.py's too
    new_project(NewAnswers(name="fert", task="tabular", gpu="cpu", data=data, dest=tmp_path, folds=3, epochs=10))
    project = tmp_path / "fert"
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert (answers["problem"], answers["metric"], answers["submission"]) == ("multiclass", "map3", "label")
    log = run_script(project, "train.py", "--device", "cpu", "--models", "lgbm,mlp").stdout
    assert re.search(r"^OOF: map3=0\.\d+ over 900 rows .*\(lgbm\)$", log, re.M), log[-3000:]
    counts = pd.read_csv(data / "train.csv")["Fertilizer Name"].value_counts()
    fallback = pd.read_csv(project / "output" / "submission.csv")["Fertilizer Name"]
    assert set(fallback) == {" ".join(counts.index[:3])}, (fallback[0], counts)
    assert "(the three most common classes for every row)" in log
    run_script(project, "predict.py", "--device", "cpu")
    sub = pd.read_csv(project / "output" / "submission.csv")["Fertilizer Name"]
    assert all(len(set(s.split())) == 3 and set(s.split()) <= set(counts.index) for s in sub), sub.head()
    held_out = {"three": _map3(sub, truth), "first only": _map3(sub.str.split().str[0], truth)}
    held_out["prior"] = _map3(fallback, truth)
    print(f"held-out MAP@3: {held_out}")
    assert held_out["three"] > held_out["first only"] + 0.05 and held_out["three"] > held_out["prior"] + 0.03, held_out
    env = {**RUN_ENV, "KAGGLE_EVALUATION_PORT": str(free_port()), "STANDIN_BATCH_ROWS": "64"}
    served = run_script(project, "serve.py", "--device", "cpu", env=env).stdout  # the evaluation API's answers
    assert "0 fallback" in served, served[-2000:]
    assert pd.read_parquet(project / "submission.parquet")["Fertilizer Name"].tolist() == sub.tolist()
    m = import_project(project, ("submission",))
    sample = pd.read_csv(data / "sample_submission.csv")
    with pytest.raises(ValueError, match="submission label 'DAP Urea compost' is not a class"):
        m.submission.check_submission(
            sample.assign(**{"Fertilizer Name": "DAP Urea compost"}), sample, "labels", counts.index
        )


def test_metric_f1_scores_the_labels_and_its_fallback_is_the_positive_class(tmp_path):
    """--metric f1 (Disaster Tweets, Quora; mcc alike: Playground S4E8) scores the labels handed
    in, F1 of the second class. kagtpl had no such metric (`kagtpl new` refused it). The fallback
    is the positive class for every row: the majority, the prior under accuracy, scores F1 0 where
    it is the negative class (here, as titanic's 0, 62% of rows)."""
    from sklearn.metrics import f1_score

    from kagtpl.new import NewAnswers, new_project

    data = table.write_table(tmp_path / "data", "binary-label")  # breast cancer: 1 (benign) the majority, flipped
    for path, column in ((data / "train.csv", "target"), (tmp_path / "data_solution.csv", None)):
        frame = pd.read_csv(path)
        column = column or frame.columns[1]
        frame[column] = 1 - frame[column]
        frame.to_csv(path, index=False)
    new_project(NewAnswers(name="comp", task="tabular", gpu="cpu", data=data, dest=tmp_path, folds=3, metric="f1"))
    project = tmp_path / "comp"
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert (answers["problem"], answers["submission"], answers["metric"]) == ("binary", "label", "f1")
    log = run_script(project, "train.py", "--device", "cpu", "--models", "lgbm,mlp", "--booster-rounds", "300").stdout
    sample = pd.read_csv(data / answers["sample_submission"])
    fallback = pd.read_csv(project / "output" / "submission.csv")
    classes = sorted(pd.read_csv(data / "train.csv")[answers["target"]].astype(str).unique())
    assert set(fallback.iloc[:, 1].astype(str)) == {classes[1]} and "(the positive class for every row)" in log
    said = re.search(r"^OOF: f1=([\d.]+) over \d+ rows from folds \[0, 1, 2\] \(mlp\)$", log, re.M)
    oof = pd.read_csv(project / "output" / "oof.csv")
    assert said and float(said[1]) == pytest.approx(
        f1_score(oof["target"], oof[["p_0", "p_1"]].to_numpy().argmax(1)), abs=1e-4
    )
    log = run_script(project, "predict.py", "--device", "cpu").stdout
    # the labels are cut where the blend's OOF rows score the best F1 (0.5 before: the argmax's)
    cut = re.search(r"^THRESHOLD: labels are the positive class where its probability >= ([\d.]+): OOF F1", log, re.M)
    assert cut, log[-3000:]
    sub = pd.read_csv(project / "output" / "submission.csv")
    truth = pd.read_csv(tmp_path / "data_solution.csv").iloc[:, 1].astype(str)
    assert list(sub.columns) == list(sample.columns) and set(sub.iloc[:, 1].astype(str)) <= set(classes)
    held_out = f1_score(truth, sub.iloc[:, 1].astype(str), pos_label=classes[1])
    assert held_out > f1_score(truth, fallback.iloc[:, 1].astype(str), pos_label=classes[1]) + 0.1, held_out
    (project / "serve_f1.py").write_text(SERVE_F1)  # serve.py's ensemble cuts where predict.py cut
    served = run_script(project, "serve_f1.py", str(data), answers["test_csv"], answers["sample_submission"]).stdout
    assert f"CONFIG THRESHOLD {float(cut[1])}" in served, served[-2000:]
    assert pd.read_csv(project / "served.csv").equals(sub), pd.read_csv(project / "served.csv").head()


SERVE_F1 = """
import sys, time
from pathlib import Path
import pandas as pd, torch
import predict
from machinery import serving
data = Path(sys.argv[1])
columns = list(pd.read_csv(data / sys.argv[3], nrows=0).columns)
clock = serving.StartClock(time.time(), 600)
ensemble = predict.load_ensemble(Path("output"), data, columns, torch.device("cpu"), clock)
print("CONFIG THRESHOLD", ensemble.config.get("threshold"))
predict.predict_batch(ensemble, {}, pd.read_csv(data / sys.argv[2])).to_csv("served.csv", index=False)
"""
