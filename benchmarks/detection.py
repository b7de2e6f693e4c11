"""A CPU score for --task detection on generated shapes data, under `run.py --budget 10m`: COCO
mAP@.5 and mAP@[.5:.95] of the default project on held-out images, the gain of weighted box
fusion over the best single fold on the same images, and a classical baseline on the same folds.

    python benchmarks/detection.py [--budget 10m] [--train 200] [--test 50] [--size 128] [--flags '--epochs 2']

The data is `kagtpl shapes --task detection` (Global Wheat's layout: ellipses to find among
triangles and lines, on noise and a lighting gradient; a quarter of the images without an
object), rendered by `kagtpl new --task detection` as a user would, with the default detector,
backbone and plan for the CPU (FCOS on ResNet-18, from scratch). After the run, predict.py is run
again on each fold's checkpoint alone, and on every fold without flip TTA (with the folds weighed
by their validation mAP, the default, and not), so that the fused submission, the folds fused and
each single fold are scored on the same test images. The gain of the fusion is given over the
fold with the best validation loss (the one a user could pick) and over the fold that scored best
on the test images (known only in hindsight).

The baseline, OpenCV's edges and ellipse fitting: Canny edges, their outer contours, an ellipse
fitted to each (cv2.fitEllipse); a contour's box is scored by how well the ellipse fits it (its
area over the ellipse's, and its solidity). Its Canny threshold and smallest side are chosen on
each fold's training images (mAP@.5) and it is scored on the same validation images as the
project's OOF predictions, then chosen on all training images for the held-out ones.

Every score is pycocotools' (COCOeval, bbox), the reference the project's own metric is checked
against in tests/test_detection.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "generator"))
from _project import cpu_project, run_budget, shapes_args, work_dir  # noqa: E402

from kagtpl import shapes  # noqa: E402

CANNY = (30, 60, 100)  # the baseline's lower Canny threshold (the upper is twice it), chosen per fold
MIN_SIDE = (6, 10, 16)  # px: smaller contours are noise


def coco_map(truth: dict, found: dict, ids: list) -> tuple[float, float]:
    """(mAP@.5, mAP@[.5:.95]) by pycocotools: truth {id: (n, 4) xyxy}, found {id: [(xyxy, score)]}."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images = [{"id": k, "width": 1, "height": 1} for k in range(len(ids))]
    anns, dets = [], []
    for k, image_id in enumerate(ids):
        for b in truth.get(image_id, []):
            w, h = b[2] - b[0], b[3] - b[1]
            anns.append({"id": len(anns) + 1, "image_id": k, "category_id": 1, "bbox": [b[0], b[1], w, h],
                         "area": w * h, "iscrowd": 0})  # fmt: skip
        for b, s in found.get(image_id, []):
            dets.append({"image_id": k, "category_id": 1, "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "score": s})
    if not dets:
        return 0.0, 0.0
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns, "categories": [{"id": 1}]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(dets), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[1]), float(ev.stats[0])


def submission_boxes(path: Path) -> dict:
    """A submission's 'score x y w h' groups -> {id: [(xyxy, score)]}."""
    sub = pd.read_csv(path, dtype=str, keep_default_na=False)
    out = {}
    for image_id, text in zip(sub.iloc[:, 0], sub.iloc[:, 1], strict=True):
        v = np.array(text.split(), float).reshape(-1, 5)
        out[image_id] = [((x, y, x + w, y + h), s) for s, x, y, w, h in v]
    return out


def solution_boxes(path: Path) -> dict:
    out = {}
    for row in pd.read_csv(path, dtype={"image_id": str}).itertuples():
        out.setdefault(row.image_id, []).append((row.x1, row.y1, row.x2, row.y2))
    return out


def train_boxes(data: Path) -> dict:
    """train.csv (wheat layout: bbox "[x, y, w, h]") -> {id: [xyxy]}."""
    out = {}
    for image_id, cell in pd.read_csv(data / "train.csv", dtype=str).loc[:, ["image_id", "bbox"]].itertuples(False):
        x, y, w, h = json.loads(cell)
        out.setdefault(image_id, []).append((x, y, x + w, y + h))
    return out


class Ellipses:
    """Canny edges -> outer contours -> a fitted ellipse each; scored by the fit."""

    name = "Canny + ellipse fit (OpenCV)"

    def __init__(self, canny: int = 60, min_side: int = 10):
        self.canny, self.min_side = canny, min_side

    def detect(self, img: np.ndarray) -> list:
        grey = cv2.GaussianBlur(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), (5, 5), 1.2)
        edges = cv2.dilate(cv2.Canny(grey, self.canny, 2 * self.canny), np.ones((3, 3), np.uint8))
        contours, _ = cv2.findContours(edges, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        found = []
        for c in contours:
            x, y, w, h = cv2.boundingRect(c)
            if min(w, h) < self.min_side or len(c) < 5:
                continue
            (_, _), (a, b), _ = cv2.fitEllipse(c)
            area, hull = cv2.contourArea(c), cv2.contourArea(cv2.convexHull(c))
            fit = area / max(np.pi * a * b / 4, 1.0)
            score = float(np.exp(-4 * abs(1 - fit)) * area / max(hull, 1.0))
            found.append(((x, y, x + w, y + h), score))
        return found

    def fit(self, images: dict, truth: dict) -> Ellipses:
        """The Canny threshold and smallest side with the best mAP@.5 on these images."""
        ids = list(images)
        best = max(
            ((c, s) for c in CANNY for s in MIN_SIDE),
            key=lambda p: coco_map(truth, {i: Ellipses(*p).detect(images[i]) for i in ids}, ids)[0],
        )
        self.canny, self.min_side = best
        return self

    def score(self, images: dict, truth: dict) -> tuple[float, float]:
        ids = list(images)
        return coco_map(truth, {i: self.detect(images[i]) for i in ids}, ids)


def load(folder: Path, ids) -> dict:
    return {i: np.asarray(Image.open(folder / f"{i}.png").convert("RGB")) for i in ids}


def predict(project: Path, out_dir: Path, name: str, *flags: str) -> Path:
    """predict.py on the checkpoints in `out_dir` (and its postprocess.json) -> the submission."""
    command = [sys.executable, "predict.py", "--device", "cpu", "--out-dir", str(out_dir), "--submission", name]
    run = subprocess.run([*command, *flags], cwd=project, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"predict.py exited {run.returncode}: {run.stdout[-1500:]} {run.stderr[-1500:]}")
    if not (out_dir / name).is_file():  # it kept the fallback: no fold was validated inside the budget
        sys.exit(f"predict.py wrote no {name}: {run.stdout.strip().splitlines()[-1:]}; give the run a larger --budget")
    return out_dir / name


def one_fold(project: Path, out: Path, ckpt: Path, work: Path) -> Path:
    folder = work / ckpt.stem
    folder.mkdir()
    for path in (ckpt, out / "postprocess.json"):
        shutil.copy2(path, folder / path.name)
    return predict(project, folder, "submission.csv", "--no-tta")


def main() -> None:
    args = shapes_args()
    work = work_dir("kagtpl-det-bench-")
    data = shapes.write_boxes(work / "boxes", "wheat", args.train, args.test, args.size)
    solution = solution_boxes(work / "boxes_solution.csv")
    test_ids = list(pd.read_csv(data / "sample_submission.csv", dtype=str)["image_id"])
    project = cpu_project(work, "det", "detection", data)
    log, wall = run_budget(project, args.budget, tuple(shlex.split(args.flags)))
    out = project / "output"
    oof_line = re.search(r"^OOF: mAP@\.5=([\d.]+), mAP@\[\.5:\.95\]=([\d.]+)", log, re.M)
    oof_score = (float(oof_line.group(1)), float(oof_line.group(2))) if oof_line else (float("nan"),) * 2

    def scored(path: Path) -> tuple[float, float]:
        return coco_map(solution, submission_boxes(path), test_ids)

    none = (float("nan"), float("nan"))  # no OOF score of its own
    rows = [("FCOS/ResNet-18 (kagtpl): folds + flip TTA, WBF", oof_score, scored(out / "submission.csv"), wall)]
    t0 = time.time()
    fused = scored(predict(project, out, "no_tta.csv", "--no-tta"))
    rows.append(("  folds by WBF, no TTA", none, fused, time.time() - t0))
    t0 = time.time()
    flat = scored(predict(project, out, "flat.csv", "--no-tta", "--no-weigh-folds"))
    rows.append(("  folds by WBF, no TTA, folds not weighed", none, flat, time.time() - t0))
    singles = []
    for ckpt in sorted(out.glob("model_fold*.pth")):
        t0 = time.time()
        score = scored(one_fold(project, out, ckpt, work))
        singles.append(score)
        rows.append((f"  {ckpt.stem} alone, no TTA", none, score, time.time() - t0))

    oof_files = sorted(out.glob("oof_fold*.csv"))
    oof = pd.concat([pd.read_csv(f, usecols=["id", "fold"], dtype={"id": str}) for f in oof_files])
    truth = train_boxes(data)
    train_ids = sorted(f.stem for f in (data / "train").glob("*.png"))
    images = load(data / "train", train_ids)
    t0 = time.time()
    found, ids = {}, []
    for k in sorted(oof["fold"].unique()):
        valid = set(oof.loc[oof["fold"] == k, "id"])
        model = Ellipses().fit({i: images[i] for i in train_ids if i not in valid}, truth)
        ids += sorted(valid)
        found.update({i: model.detect(images[i]) for i in valid})
    baseline_oof = coco_map(truth, found, ids)
    model = Ellipses().fit(images, truth)
    rows.append((Ellipses.name, baseline_oof, model.score(load(data / "test", test_ids), solution), time.time() - t0))

    folds = sorted(int(k) for k in oof["fold"].unique())
    print(f"\n{args.train} training, {args.test} held-out {args.size} px images; folds {folds}, {len(oof)} OOF images")
    print(f"{'':50s} {'OOF mAP@.5':>10s} {'@[.5:.95]':>9s} {'test mAP@.5':>11s} {'@[.5:.95]':>9s} {'wall s':>7s}")
    for name, (o50, o), (t50, t), seconds in rows:
        print(f"{name:50s} {o50:10.4f} {o:9.4f} {t50:11.4f} {t:9.4f} {seconds:7.0f}")
    val = {int(k): float(v) for k, v in re.findall(r"^FOLD (\d+) DONE: best val loss ([\d.]+)", log, re.M)}
    chosen = min(val, key=val.get)  # the fold one would pick without the test labels: best validation
    hindsight = max(range(len(singles)), key=lambda k: singles[k][1])
    for what, k in (("the best validation loss", chosen), ("the best test score, in hindsight", hindsight)):
        gain = [f - s for f, s in zip(fused, singles[k], strict=True)]
        print(
            f"\nWBF of {len(singles)} folds (no TTA) over fold {k}, {what}, on the same test images: "
            f"mAP@.5 {gain[0]:+.4f}, mAP@[.5:.95] {gain[1]:+.4f}"
        )


if __name__ == "__main__":
    main()
