"""A small segmentation competition to try --task segmentation on: shapes and textures on
cluttered backgrounds, with their true masks, in the layouts Kaggle's mask competitions use.

Targets are ellipses (class `ellipse`) and, for two classes, rectangles (`rectangle`); triangles,
lines and noise are clutter that must stay out of the masks. About a quarter of the images hold
no target at all (an empty mask, as in most of these competitions). Layouts:

- `png`: train/<id>.png and train_masks/<id>.png (0/255), sample_submission.csv (id, rle)
- `rle`: train/<id>.png and train.csv (id, rle), one row per image, "" for an empty mask
- `classes`: train_masks/<id>.png with class indices 0/1/2, sample_submission (id, class, rle)
- `rle-classes`: train.csv (id, class, rle), a row per image and class

RLE is Kaggle's usual: 1-indexed start/length pairs in column-major order. Beside the folder,
<folder>_solution.csv holds the test masks (the sample's rows) for scoring.
"""

from __future__ import annotations

import csv
from pathlib import Path

from kagtpl.errors import KagtplError

LAYOUTS = ("png", "rle", "classes", "rle-classes")
CLASSES = ("ellipse", "rectangle")


def runs(mask) -> str:
    """1-indexed start/length pairs of a 0/1 mask read down its columns (Kaggle's usual order).
    Written apart from the project's masks.rle_encode, so each checks the other."""
    import numpy as np

    column_major = np.asarray(mask, bool).T.ravel()
    out, i, n = [], 0, len(column_major)
    while i < n:
        if column_major[i]:
            j = i
            while j < n and column_major[j]:
                j += 1
            out += [str(i + 1), str(j - i)]
            i = j
        else:
            i += 1
    return " ".join(out)


def draw_image(rng, size: int, two_classes: bool, with_boxes: bool = False):
    """An RGB image and its class-index mask (0 background, 1 ellipse, 2 rectangle); `with_boxes`:
    also each target's (class, [x1, y1, x2, y2]) in pixels."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    yy, xx = np.mgrid[0:size, 0:size] / size
    base = rng.uniform(60, 160, 3)
    slope = rng.uniform(-60, 60, (3, 2))
    background = (
        base[:, None, None] + slope[:, 0, None, None] * yy + slope[:, 1, None, None] * xx
    )  # a lighting gradient
    pixels = np.clip(background.transpose(1, 2, 0) + rng.normal(0, 18, (size, size, 3)), 0, 255)
    img = Image.fromarray(pixels.astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.6))
    mask = Image.new("L", (size, size), 0)
    draw, paint = ImageDraw.Draw(img), ImageDraw.Draw(mask)

    def box(low: float, high: float):
        w, h = rng.uniform(low, high, 2) * size
        x0, y0 = rng.uniform(0, size - w), rng.uniform(0, size - h)
        return [x0, y0, x0 + w, y0 + h]

    def colour():
        return tuple(int(v) for v in rng.uniform(0, 255, 3))

    for _ in range(rng.integers(2, 6)):  # clutter: lines and triangles, never in the mask
        x0, y0, x1, y1 = box(0.1, 0.6)
        if rng.random() < 0.5:
            draw.line([x0, y0, x1, y1], fill=colour(), width=int(rng.integers(1, 4)))
        else:
            draw.polygon([(x0, y1), ((x0 + x1) / 2, y0), (x1, y1)], fill=colour())
    targets, found = 0 if rng.random() < 0.25 else int(rng.integers(1, 4)), []
    for _ in range(targets):
        kind = 2 if two_classes and rng.random() < 0.5 else 1
        shape = box(0.12, 0.35)
        fill = colour()
        (draw.ellipse if kind == 1 else draw.rectangle)(shape, fill=fill, outline=colour())
        (paint.ellipse if kind == 1 else paint.rectangle)(shape, fill=kind)
        found.append((kind, [round(float(v), 1) for v in shape]))
    return (img, np.asarray(mask), found) if with_boxes else (img, np.asarray(mask))


def write_shapes(
    dest: Path, layout: str = "png", n_train: int = 120, n_test: int = 30, size: int = 96, seed: int = 0
) -> Path:
    """The competition in `layout` under `dest`; returns `dest`."""
    rng = start(dest, layout, LAYOUTS, "layouts", size, n_train, n_test, seed)
    import numpy as np
    from PIL import Image

    two = layout in ("classes", "rle-classes")
    classes = CLASSES if two else CLASSES[:1]
    files = layout in ("png", "classes")
    for folder in ("train", "test", *(["train_masks"] if files else [])):
        (dest / folder).mkdir(parents=True, exist_ok=True)
    train_rows, sample_rows, solution_rows = [], [], []
    for i in range(n_train + n_test):
        image_id = f"img{i:04d}"
        img, mask = draw_image(rng, size, two)
        split = "train" if i < n_train else "test"
        img.save(dest / split / f"{image_id}.png")
        if split == "train" and files:
            Image.fromarray((mask > 0).astype(np.uint8) * 255 if not two else mask).save(
                dest / "train_masks" / f"{image_id}.png"
            )
        for k, name in enumerate(classes, start=1):
            rle = runs(mask == k)
            if split == "train" and not files:
                train_rows.append([image_id, *([name] if two else []), rle])
            if split == "test":
                sample_rows.append([image_id, *([name] if two else []), ""])
                solution_rows.append([image_id, *([name] if two else []), rle])
    header = ["id", *(["class"] if two else []), "rle"]
    if not files:
        write_csv(dest / "train.csv", header, train_rows)
    write_csv(dest / "sample_submission.csv", header, sample_rows)
    write_csv(dest.parent / f"{dest.name}_solution.csv", header, solution_rows)
    return dest


def start(dest: Path, layout: str, layouts: tuple, what: str, size: int, n_train: int, n_test: int, seed: int):
    """The checks every generated competition makes before writing; its random generator. An
    existing non-empty folder (or solution file) is refused, as kagtpl sounds refuses it: images
    left in it from another run would be read as part of this competition (a detection project
    took stale images for negatives)."""
    if layout not in layouts:
        raise KagtplError(f"unknown layout {layout!r}; valid {what}: {', '.join(layouts)}")
    if size < 32 or n_train < 4 or n_test < 1:
        raise KagtplError(f"--size {size}, --train {n_train}, --test {n_test}: at least 32 px, 4 and 1 images")
    dest = Path(dest)
    for path in (dest, dest.parent / f"{dest.name}_solution.csv"):
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise KagtplError(f"{path} exists; kagtpl shapes never overwrites: pick another folder")
    try:
        import numpy as np
        import PIL  # noqa: F401  (draw_image's)
    except ImportError as e:
        raise KagtplError(f"writing images needs the training packages: pip install 'kagtpl[train]' ({e})") from e
    return np.random.default_rng(seed)


def write_csv(path: Path, header: list, rows: list) -> None:
    """A CSV with Kaggle's \\n line ends; cells holding a comma ("[x, y, w, h]") quoted."""
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([header, *rows])


def dice_score(submission: Path, solution: Path, shape: tuple[int, int]) -> float:
    """Mean per-row Dice of a submission against the solution (both RLE, the sample's rows);
    an empty mask predicted empty scores 1."""
    import numpy as np
    import pandas as pd

    def decode(rle, n: int) -> np.ndarray:
        flat = np.zeros(n, bool)
        numbers = [int(v) for v in rle.split()] if isinstance(rle, str) else []
        for start, length in zip(numbers[0::2], numbers[1::2], strict=True):
            flat[start - 1 : start - 1 + length] = True
        return flat

    sub = pd.read_csv(submission, dtype=str, keep_default_na=False)
    sol = pd.read_csv(solution, dtype=str, keep_default_na=False)
    keys = list(sol.columns[:-1])
    both = sol.merge(sub, on=keys, suffixes=("_true", "_pred"), how="left")
    if both[f"{sol.columns[-1]}_pred"].isna().any():
        raise KagtplError(f"{submission}: rows of the solution are missing")
    scores = []
    for truth, pred in zip(both[f"{sol.columns[-1]}_true"], both[f"{sol.columns[-1]}_pred"], strict=True):
        t, p = decode(truth, shape[0] * shape[1]), decode(pred, shape[0] * shape[1])
        total = t.sum() + p.sum()
        scores.append(1.0 if total == 0 else 2 * (t & p).sum() / total)
    return float(np.mean(scores))


# ----------------------------------------------------------------------------- detection

BOX_LAYOUTS = ("wheat", "voc", "lists", "strings", "rows")


def box_rows(layout: str, image_id: str, found: list, size: int) -> list[list[str]]:
    """The training CSV's rows for one image in `layout` (see write_boxes)."""
    if layout == "wheat":  # a row per box, bbox "[x, y, w, h]"; an image without boxes has no row
        return [
            [image_id, str(size), str(size), f"[{b[0]}, {b[1]}, {round(b[2] - b[0], 1)}, {round(b[3] - b[1], 1)}]"]
            for _, b in found
        ]
    if layout == "voc":  # a row per box with its class; an image without boxes: one row, no box
        if not found:
            return [[image_id, "No finding", "", "", "", ""]]
        return [[image_id, CLASSES[k - 1], *(str(v) for v in b)] for k, b in found]
    if layout == "lists":  # a row per image: relative centre boxes as a JSON list ("[]": none)
        cells = [
            [(b[0] + b[2]) / 2 / size, (b[1] + b[3]) / 2 / size, (b[2] - b[0]) / size, (b[3] - b[1]) / size]
            for _, b in found
        ]
        return [[image_id, str([[round(float(v), 5) for v in c] for c in cells])]]
    if layout == "rows":  # a row per box: left, top, width, height; an image without boxes has no row
        return [
            [image_id, str(b[0]), str(b[1]), str(round(b[2] - b[0], 1)), str(round(b[3] - b[1], 1))] for _, b in found
        ]
    numbers = [f"{v}" for _, b in found for v in (b[0], b[1], round(b[2] - b[0], 1), round(b[3] - b[1], 1))]
    return [[image_id, " ".join(numbers)]]  # strings: "x y w h x y w h ..." per image


BOX_HEADERS = {
    "wheat": ["image_id", "width", "height", "bbox"],
    "voc": ["image_id", "class_name", "x_min", "y_min", "x_max", "y_max"],
    "lists": ["id", "boxes"],
    "strings": ["id", "boxes"],
    "rows": ["image_id", "left", "top", "width", "height"],
}
# the sample submission's header: the prediction string per image, or (rows) a row per box
SAMPLE_HEADERS = {"rows": ["image_id", "left", "width", "top", "height", "score"]}


def write_boxes(
    dest: Path, layout: str = "wheat", n_train: int = 120, n_test: int = 30, size: int = 96, seed: int = 0
) -> Path:
    """A detection competition in `layout` under `dest`: train/ and test/ images, the training
    boxes and sample_submission.csv (id, PredictionString); beside it <folder>_solution.csv holds
    the test boxes (id, label, x1, y1, x2, y2 in pixels) for scoring. Layouts:

    - `wheat`: train.csv a row per box, bbox "[x, y, w, h]" in pixels; images without boxes are
      in train/ but have no row (Global Wheat Detection)
    - `voc`: train.csv a row per box: class_name, x_min, y_min, x_max, y_max; two classes, and an
      image without boxes has one row with empty coordinates (VinBigData)
    - `lists`: train.csv a row per image: a JSON list of relative [cx, cy, w, h] boxes (YOLO's)
    - `strings`: train.csv a row per image: "x y w h x y w h ..." in pixels
    - `rows`: train.csv a row per box: left, top, width, height in pixels; the submission a row per
      box too, columns image_id, left, width, top, height, score, one example row (NFL helmets)
    """
    rng = start(dest, layout, BOX_LAYOUTS, "detection layouts", size, n_train, n_test, seed)
    for folder in ("train", "test"):
        (dest / folder).mkdir(parents=True, exist_ok=True)
    id_col = BOX_HEADERS[layout][0]
    train_rows, sample_rows, solution_rows = [], [], []
    for i in range(n_train + n_test):
        image_id = f"img{i:04d}"
        img, _, found = draw_image(rng, size, layout == "voc", with_boxes=True)
        split = "train" if i < n_train else "test"
        img.save(dest / split / f"{image_id}.png")
        if split == "train":
            train_rows += box_rows(layout, image_id, found, size)
        elif layout == "rows":
            sample_rows = sample_rows or [[image_id, "0", "1", "0", "1", "0.5"]]  # an example, as Kaggle's are
        else:
            sample_rows.append([image_id, ""])
            solution_rows += [[image_id, CLASSES[k - 1], *(str(v) for v in b)] for k, b in found]

    write_csv(dest / "train.csv", BOX_HEADERS[layout], train_rows)
    write_csv(dest / "sample_submission.csv", SAMPLE_HEADERS.get(layout, [id_col, "PredictionString"]), sample_rows)
    write_csv(dest.parent / f"{dest.name}_solution.csv", [id_col, "label", "x1", "y1", "x2", "y2"], solution_rows)
    return dest
