"""`kagtpl table`: a small real table competition (from scikit-learn's datasets) to try
`--task tabular` on, with the answers held out beside it."""

from __future__ import annotations

from pathlib import Path

from kagtpl import paths
from kagtpl.errors import KagtplError

TABLES = ("binary", "binary-label", "multiclass", "multiclass-label", "regression")


def write_table(dest: Path, kind: str = "binary", seed: int = 0, test_frac: float = 0.2) -> Path:
    """A realistic small competition table from a real scikit-learn dataset: train.csv,
    test.csv and the submission template, with NaN in numeric columns, a string category with
    gaps, ids that are not 0..n, and the held-out answers beside the folder (<dest>_solution.csv).

    binary: breast cancer, probability column (AUC); binary-label: the same, 0/1 labels like
    titanic's gender_submission.csv (accuracy); multiclass: wine, one probability column per
    cultivar (log loss); multiclass-label: iris, a species column (accuracy); regression:
    diabetes progression (RMSE)."""
    if kind not in TABLES:
        raise KagtplError(f"unknown kind {kind!r}; valid kinds: {', '.join(TABLES)}")
    if dest.exists() and not dest.is_dir():
        raise KagtplError(f"{dest} exists and is not a folder")
    written = [dest / n for n in ("train.csv", "test.csv", "sample_submission.csv", "gender_submission.csv")]
    for path in [*written, dest.parent / f"{dest.name}_solution.csv"]:
        if path.exists():
            raise KagtplError(f"{path} exists; kagtpl table never overwrites: pick another folder")
    paths.check_writable_folder(dest, "table")
    try:
        import numpy as np
        import pandas as pd
        from sklearn import datasets
    except ImportError as e:
        raise KagtplError(f"tables need the training packages: pip install 'kagtpl[train]' ({e})") from e
    rng = np.random.default_rng(seed)
    loader = {
        "binary": datasets.load_breast_cancer,
        "binary-label": datasets.load_breast_cancer,
        "multiclass": datasets.load_wine,
        "multiclass-label": datasets.load_iris,
        "regression": datasets.load_diabetes,
    }[kind]
    bunch = loader(as_frame=True)
    df = bunch.frame.rename(columns=lambda c: str(c).replace(" ", "_").replace("(cm)", "cm").strip("_"))
    target = "target"
    features = [c for c in df.columns if c != target]
    for c in features[: max(1, len(features) // 3)]:  # a third of the numeric columns lose 8% of values
        df.loc[rng.random(len(df)) < 0.08, c] = np.nan
    first = df[features[0]]
    df["grade"] = pd.cut(first.fillna(first.median()), 3, labels=["low", "mid", "high"]).astype(str)
    df.loc[rng.random(len(df)) < 0.05, "grade"] = np.nan  # a string category with gaps
    df["site"] = rng.choice(["north", "south", "east", "west", "centre"], len(df))
    if kind == "regression":
        df["sex"] = np.where(df["sex"] > 0, "M", "F")
    names = {
        "multiclass": [f"cultivar_{k}" for k in range(3)],
        "multiclass-label": ["setosa", "versicolor", "virginica"],
    }
    if kind in names:
        df[target] = [names[kind][k] for k in df[target]]
    id_col = "row_id" if kind != "binary-label" else "PassengerId"
    df.insert(
        0,
        id_col,
        [f"r{9000 + 7 * i}" for i in range(len(df))] if kind != "binary-label" else np.arange(892, 892 + len(df)),
    )
    df = df.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    n_test = int(len(df) * test_frac)
    test, train = df.iloc[:n_test], df.iloc[n_test:]
    dest.mkdir(parents=True, exist_ok=True)
    train.rename(columns={target: "label" if kind == "multiclass" else target}).to_csv(dest / "train.csv", index=False)
    test.drop(columns=[target]).to_csv(dest / "test.csv", index=False)
    if kind == "multiclass":
        sample = pd.DataFrame({id_col: test[id_col], **{c: 1 / 3 for c in names[kind]}})
        sub_name = "sample_submission.csv"
    elif kind == "binary-label":
        sample, sub_name = pd.DataFrame({id_col: test[id_col], target: 0}), "gender_submission.csv"
    else:
        fill = {"binary": 0.5, "multiclass-label": "setosa", "regression": 150.0}[kind]
        sample, sub_name = pd.DataFrame({id_col: test[id_col], target: fill}), "sample_submission.csv"
    sample.to_csv(dest / sub_name, index=False)
    test[[id_col, target]].to_csv(dest.parent / f"{dest.name}_solution.csv", index=False)
    return dest
