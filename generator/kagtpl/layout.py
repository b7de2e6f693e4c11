"""Detect a competition's data layout from its folder (at generation time)."""

from __future__ import annotations

import csv
from pathlib import Path

from kagtpl.errors import KagtplError

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
LABEL_CSVS = ("labels.csv", "train.csv", "train_labels.csv")
TRAIN_DIRS = ("train", "train_images", "images/train", "images")
TEST_DIRS = ("test", "test_images", "images/test")
LAYOUT_KEYS = ("labels_csv", "id_col", "label_col", "train_dir", "test_dir", "image_ext", "sample_submission")


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError) as e:
        raise KagtplError(f"{path}: cannot read the CSV header ({e})") from e


def _first_value(path: Path, column: str) -> str | None:
    with open(path, newline="") as f:
        row = next(csv.DictReader(f), None)
    return None if row is None else row.get(column)


def _pick(data: Path, given: str | None, candidates, what: str, is_ok) -> str:
    if given:
        if not is_ok(data / given):
            raise KagtplError(f"--data {data}: {what} {given!r} not found")
        return given
    for name in candidates:
        if is_ok(data / name):
            return name
    raise KagtplError(
        f"--data {data} does not look like an image competition: no {what} (looked for {', '.join(candidates)})"
    )


def detect(data: Path, overrides: dict[str, str | None]) -> dict[str, str]:
    """Answers for the layout keys; `overrides` (flags) win over what is found."""
    if not data.is_dir():
        raise KagtplError(f"--data {data}: no such folder")
    o = {k: overrides.get(k) for k in LAYOUT_KEYS}
    subs = sorted(p.name for p in data.glob("*submission*.csv"))
    sample = _pick(
        data, o["sample_submission"], ["sample_submission.csv", *subs], "sample submission CSV", Path.is_file
    )
    labels = _pick(data, o["labels_csv"], LABEL_CSVS, "labels CSV", Path.is_file)
    sample_cols, label_cols = _header(data / sample), _header(data / labels)
    if len(sample_cols) < 2:
        raise KagtplError(f"{data / sample}: a sample submission needs an id column and at least one more")
    id_col = o["id_col"] or (sample_cols[0] if sample_cols[0] in label_cols else label_cols[0])
    if id_col not in label_cols:
        raise KagtplError(f"{data / labels}: no id column {id_col!r} (columns: {label_cols})")
    others = [c for c in label_cols if c != id_col]
    label_col = o["label_col"]
    if not label_col:
        if len(sample_cols) == 2 and sample_cols[1] in others:
            label_col = sample_cols[1]
        elif len(others) == 1:
            label_col = others[0]
        else:
            raise KagtplError(f"{data / labels}: cannot tell the label column among {others}; pass --label-col")
    if label_col not in label_cols:
        raise KagtplError(f"{data / labels}: no label column {label_col!r} (columns: {label_cols})")
    has_images = lambda p: p.is_dir() and any(q.suffix.lower() in IMAGE_EXTS for q in p.iterdir())  # noqa: E731
    train_dir = _pick(data, o["train_dir"], TRAIN_DIRS, "training image folder", has_images)
    test_dir = _pick(data, o["test_dir"], TEST_DIRS, "test image folder", has_images)
    ext = o["image_ext"]
    if not ext:
        first_id = _first_value(data / labels, id_col) or ""
        found = [e for e in IMAGE_EXTS if (data / train_dir / f"{first_id}{e}").is_file()]
        if Path(first_id).suffix.lower() in IMAGE_EXTS:
            found = [Path(first_id).suffix]
        if not found:
            raise KagtplError(f"{data / train_dir}: no image named after the first id {first_id!r}; pass --image-ext")
        ext = found[0]
    return {
        "labels_csv": labels,
        "id_col": id_col,
        "label_col": label_col,
        "train_dir": train_dir,
        "test_dir": test_dir,
        "image_ext": ext,
        "sample_submission": sample,
    }
