"""A CPU score for --task segmentation on generated shapes data, under `run.py --budget 10m`,
against two classical baselines on the same folds and the same held-out images (and the floor:
every mask empty, which scores the share of empty images).

    python benchmarks/segmentation.py [--budget 10m] [--train 200] [--test 50] [--size 128] [--flags '--epochs 2']

The data is `kagtpl shapes` (ellipses to find among triangles, lines, noise and a lighting
gradient; a quarter of the images empty), rendered by `kagtpl new --task segmentation` as a user
would, with the default model, arch and plan for the CPU. The baselines:

- Otsu: each image's grey levels split by Otsu's threshold, the brighter or darker side
  (whichever scores better on the fold's training images) as the mask;
- per-pixel logistic regression on local features (the colour, Gaussian blurs of the grey image
  at 4 scales, gradient magnitudes and local contrast), fitted on pixels sampled from the fold's
  training images, its threshold chosen on those images.

Both are fitted on the training images of each fold the run finished and scored on the same
validation images (mean per-image Dice; an empty mask predicted empty scores 1), then fitted on
all training images to predict the held-out ones, scored against the solution file by
`shapes.dice_score`, as the project's submission is.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
from PIL import Image
from sklearn.linear_model import LogisticRegression

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "generator"))
from _project import cpu_project, run_budget, shapes_args, work_dir  # noqa: E402

from kagtpl import shapes  # noqa: E402

THRESHOLDS = np.linspace(0.1, 0.9, 17)
PIXELS_PER_IMAGE = 400  # logistic regression: pixels sampled from each training image


def dice(truth: np.ndarray, pred: np.ndarray) -> float:
    total = truth.sum() + pred.sum()
    return 1.0 if total == 0 else 2.0 * (truth & pred).sum() / total


def features(img: np.ndarray) -> np.ndarray:
    """(H * W, F) local features of one RGB image."""
    rgb = img.astype(np.float32) / 255.0
    grey = rgb.mean(2)
    cols = [rgb[..., k] for k in range(3)] + [grey]
    for sigma in (1, 2, 4, 8):
        blur = cv2.GaussianBlur(grey, (0, 0), sigma)
        gx, gy = cv2.Sobel(blur, cv2.CV_32F, 1, 0), cv2.Sobel(blur, cv2.CV_32F, 0, 1)
        square = cv2.GaussianBlur(grey * grey, (0, 0), sigma)
        cols += [blur, np.hypot(gx, gy), np.sqrt(np.maximum(square - blur * blur, 0))]
    return np.stack(cols, -1).reshape(-1, len(cols))


class Logistic:
    name = "per-pixel logistic regression"

    def fit(self, images: list, masks: list) -> Logistic:
        rng = np.random.default_rng(0)
        rows = [rng.choice(m.size, PIXELS_PER_IMAGE, replace=False) for m in masks]
        x = np.concatenate([features(i)[r] for i, r in zip(images, rows, strict=True)])
        y = np.concatenate([m.reshape(-1)[r] for m, r in zip(masks, rows, strict=True)])
        self.mean, self.std = x.mean(0), x.std(0) + 1e-6
        self.model = LogisticRegression(max_iter=2000, C=1.0).fit((x - self.mean) / self.std, y)
        probs = [self.probs(i) for i in images]
        pairs = list(zip(masks, probs, strict=True))
        self.threshold = max(THRESHOLDS, key=lambda t: np.mean([dice(m, p > t) for m, p in pairs]))
        return self

    def probs(self, img: np.ndarray) -> np.ndarray:
        x = (features(img) - self.mean) / self.std
        return self.model.predict_proba(x)[:, 1].reshape(img.shape[:2])

    def predict(self, img: np.ndarray) -> np.ndarray:
        return self.probs(img) > self.threshold


class Empty:
    """The floor: every mask empty (the fallback submission). Scores the share of empty images."""

    name = "empty masks (the fallback)"

    def fit(self, images: list, masks: list) -> Empty:
        return self

    def predict(self, img: np.ndarray) -> np.ndarray:
        return np.zeros(img.shape[:2], bool)


class Otsu:
    name = "Otsu threshold"

    @staticmethod
    def split(img: np.ndarray) -> np.ndarray:
        grey = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
        return cv2.threshold(grey, 0, 1, cv2.THRESH_BINARY + cv2.THRESH_OTSU)[1].astype(bool)

    def fit(self, images: list, masks: list) -> Otsu:
        bright = np.mean([dice(m, self.split(i)) for i, m in zip(images, masks, strict=True)])
        dark = np.mean([dice(m, ~self.split(i)) for i, m in zip(images, masks, strict=True)])
        self.bright = bright >= dark
        return self

    def predict(self, img: np.ndarray) -> np.ndarray:
        mask = self.split(img)
        return mask if self.bright else ~mask


def load(folder: Path, ids) -> list:
    return [np.asarray(Image.open(folder / f"{i}.png").convert("RGB")) for i in ids]


def truth(data: Path, ids) -> list:
    return [np.asarray(Image.open(data / "train_masks" / f"{i}.png")) > 0 for i in ids]


def mean_dice(model, data: Path, ids) -> float:
    preds = [model.predict(img) for img in load(data / "train", ids)]
    return float(np.mean([dice(t, p) for t, p in zip(truth(data, ids), preds, strict=True)]))


def main() -> None:
    args = shapes_args()
    work = work_dir("kagtpl-seg-bench-")
    data = shapes.write_shapes(work / "shapes", "png", args.train, args.test, args.size)
    solution = work / "shapes_solution.csv"
    project = cpu_project(work, "seg", "segmentation", data)
    log, wall = run_budget(project, args.budget, tuple(shlex.split(args.flags)))
    chosen = json.loads((project / "output" / "postprocess.json").read_text())
    oof = pd.concat([pd.read_csv(f) for f in sorted((project / "output").glob("oof_fold*.csv"))])
    all_ids = pd.read_csv(data / "sample_submission.csv")  # the held-out ids
    train_ids = sorted(f.stem for f in (data / "train").glob("*.png"))
    sub = project / "output" / "submission.csv"
    rows = [("U-Net (kagtpl segmentation)", chosen["tuned"], shapes.dice_score(sub, solution, (args.size,) * 2), wall)]
    for baseline in (Empty(), Otsu(), Logistic()):
        t0 = time.time()
        oof_scores = []
        for k in sorted(oof["fold"].unique()):
            valid = list(oof.loc[oof["fold"] == k, "id"])
            fit_ids = [i for i in train_ids if i not in set(valid)]
            model = baseline.fit(load(data / "train", fit_ids), truth(data, fit_ids))
            oof_scores.append((mean_dice(model, data, valid), len(valid)))
        oof_dice = sum(s * n for s, n in oof_scores) / sum(n for _, n in oof_scores)
        model = baseline.fit(load(data / "train", train_ids), truth(data, train_ids))
        preds = [model.predict(img) for img in load(data / "test", all_ids["id"])]
        path = work / f"{type(baseline).__name__}.csv"
        pd.DataFrame({"id": all_ids["id"], "rle": [shapes.runs(m) for m in preds]}).to_csv(path, index=False)
        rows.append((baseline.name, oof_dice, shapes.dice_score(path, solution, (args.size,) * 2), time.time() - t0))
    folds = sorted(int(k) for k in oof["fold"].unique())
    print(f"\n{args.train} training, {args.test} held-out {args.size} px images; folds {folds}, {len(oof)} OOF images")
    print(f"{'':30s} {'OOF Dice':>9s} {'held-out Dice':>14s} {'wall s':>7s}")
    for name, o, t, seconds in rows:
        print(f"{name:30s} {o:9.4f} {t:14.4f} {seconds:7.0f}")


if __name__ == "__main__":
    main()
