"""Small text competitions in the three Kaggle layouts the text task reads, written by seed.

- authors: spooky-author identification: id, text, author; the sample has a probability
  column per author (EAP, HPL, MWS).
- reviews: sentiment: id, review, sentiment (pos / neg); the sample holds the label.
- essays: essay scoring: text_id, full_text and two scores (cohesion, syntax, 1.0-5.0 in halves);
  the sample has both score columns.

Each class has its own words in a shared stream of function words, so a model can learn it
and a TF-IDF baseline scores it too; lengths vary from a few words to a few hundred tokens (the
length spread is what dynamic padding and length grouping work on)."""

from __future__ import annotations

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


LAYOUTS = {"authors": write_authors, "reviews": write_reviews, "essays": write_essays}
