"""The built-in demo: a real dataset (UCI handwritten digits, 1,797 images, shipped with
kagtpl) written in the dog-breed-identification layout, then render -> train -> predict."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
from pathlib import Path

from kagtpl import new, paths
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
    shown = shlex.join(cmd)  # as a shell reads it, a venv's path with a space too
    print(f"$ {shown}", flush=True)
    if subprocess.run(cmd, cwd=cwd).returncode != 0:
        raise KagtplError(f"demo step failed: {shown} (in {cwd})")


def demo_train_flags() -> list[str]:
    # digits are 32 px: a small CNN, no flips (a flipped 2 looks like a 5), 3 folds x 4 epochs.
    # resnet10t, measured on 2 cores (2026-11-27): OOF accuracy 0.983 after 105 s of training;
    # resnet18 gave 0.982 in 181 s (72 images/s against 140)
    return ["--device", "cpu", "--no-pretrained", "--no-hflip", "--epochs", "4", "--folds", "3", "--lr", "3e-3"]


def run_demo(dest: Path, force: bool) -> None:
    if dest.exists() and not dest.is_dir():
        raise KagtplError(f"{dest} exists and is not a folder; pick another folder")
    paths.check_writable_folder(dest, "demo")
    if dest.exists() and any(dest.iterdir()) and not force:
        raise KagtplError(f"{dest} exists and is not empty; pass --force or pick another folder")
    data = write_digits(dest / "data")
    answers = new.NewAnswers(
        name="digits",
        task="image",
        gpu="cpu",
        data=data,
        model="resnet10t",
        image_size=32,
        folds=3,
        epochs=4,
        dest=dest,
        force=force,
    )
    target = new.new_project(answers)
    run_step([sys.executable, "train.py", *demo_train_flags()], target)
    run_step([sys.executable, "predict.py", "--device", "cpu"], target)
    result = score(target / "output" / "submission.csv", dest / "data_solution.csv")
    print(
        f"DEMO: {target / 'output' / 'submission.csv'} -- held-out test logloss={result['logloss']:.4f}, "
        f"accuracy={result['accuracy']:.4f}"
    )
