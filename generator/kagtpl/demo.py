"""The built-in demo: a real dataset (UCI handwritten digits, 1,797 images, shipped with
kagtpl) written in the dog-breed-identification layout, then render -> train -> predict."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from kagtpl import project
from kagtpl.errors import KagtplError
from kagtpl.template import PACKAGE_DIR

CLASSES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def write_digits(dest: Path, n_train: int | None = None, n_test: int = 297, size: int = 32, seed: int = 0) -> Path:
    """labels.csv (id,breed), train/<id>.jpg, test/<id>.jpg, sample_submission.csv (id + one
    probability column per class) and, beside them, test_solution.csv for scoring."""
    try:
        import numpy as np
        from PIL import Image
    except ImportError as e:
        raise KagtplError(f"the demo needs the training packages: pip install 'kagtpl[train]' ({e})") from e
    d = np.load(PACKAGE_DIR / "data" / "digits.npz")
    images, target = d["images"], d["target"]
    order = np.random.default_rng(seed).permutation(len(images))
    test_idx = order[:n_test]
    train_idx = order[n_test:] if n_train is None else order[n_test : n_test + n_train]
    (dest / "train").mkdir(parents=True, exist_ok=True)
    (dest / "test").mkdir(exist_ok=True)
    ids = [hashlib.md5(f"digit-{i}".encode()).hexdigest() for i in range(len(images))]

    def save(i: int, folder: str) -> None:
        img = Image.fromarray(images[i]).resize((size, size), Image.Resampling.BICUBIC).convert("RGB")
        img.save(dest / folder / f"{ids[i]}.jpg", quality=95)

    lines = ["id,breed"]
    for i in train_idx:
        save(i, "train")
        lines.append(f"{ids[i]},{CLASSES[target[i]]}")
    (dest / "labels.csv").write_text("\n".join(lines) + "\n")
    sub, sol = ["id," + ",".join(CLASSES)], ["id,breed"]
    for i in test_idx:
        save(i, "test")
        sub.append(ids[i] + "," + ",".join(["0.1"] * len(CLASSES)))
        sol.append(f"{ids[i]},{CLASSES[target[i]]}")
    (dest / "sample_submission.csv").write_text("\n".join(sub) + "\n")
    (dest.parent / f"{dest.name}_solution.csv").write_text("\n".join(sol) + "\n")
    return dest


def score(submission: Path, solution: Path) -> dict:
    """Multiclass log loss (the dog-breed metric) and accuracy of a probability submission."""
    import pandas as pd
    from sklearn.metrics import accuracy_score, log_loss

    sub, sol = pd.read_csv(submission, dtype={"id": str}), pd.read_csv(solution, dtype={"id": str})
    sub = sub.set_index("id").loc[sol["id"]]
    y = sol["breed"].map({c: k for k, c in enumerate(CLASSES)}).to_numpy()
    probs = sub[list(CLASSES)].to_numpy()
    return {"logloss": log_loss(y, probs, labels=range(len(CLASSES))), "accuracy": accuracy_score(y, probs.argmax(1))}


def run_step(cmd: list[str], cwd: Path) -> None:
    print(f"$ {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd, cwd=cwd).returncode != 0:
        raise KagtplError(f"demo step failed: {' '.join(cmd)} (in {cwd})")


def demo_train_flags() -> list[str]:
    # digits are 32 px: a small CNN, no flips (a flipped 2 looks like a 5), 3 folds x 6 epochs
    return ["--device", "cpu", "--no-pretrained", "--no-hflip", "--epochs", "6", "--folds", "3", "--lr", "3e-3"]


def run_demo(dest: Path, force: bool) -> None:
    if dest.exists() and any(dest.iterdir()) and not force:
        raise KagtplError(f"{dest} exists and is not empty; pass --force or pick another folder")
    data = write_digits(dest / "data")
    answers = project.NewAnswers(
        name="digits",
        task="image",
        gpu="cpu",
        data=data,
        model="resnet18",
        image_size=32,
        folds=3,
        epochs=6,
        dest=dest,
        force=force,
    )
    target = project.new_project(answers)
    run_step([sys.executable, "train.py", *demo_train_flags()], target)
    run_step([sys.executable, "predict.py", "--device", "cpu"], target)
    result = score(target / "output" / "submission.csv", dest / "data_solution.csv")
    print(
        f"DEMO: {target / 'output' / 'submission.csv'} -- held-out test logloss={result['logloss']:.4f}, "
        f"accuracy={result['accuracy']:.4f}"
    )


# ----------------------------------------------------------------------------- tables

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
