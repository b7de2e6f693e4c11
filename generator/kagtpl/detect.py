"""Detect a competition's data layout from its folder (at generation time)."""

from __future__ import annotations

import collections
import itertools
import re
import statistics
from pathlib import Path

from kagtpl import csvfile
from kagtpl.errors import KagtplError
from kagtpl.paths import data_files
from kagtpl.template import tasks

IMAGE_EXTS = tasks().IMAGE_EXTS  # the template's (machinery/tasks.py): what its scripts read
DICOM = (".dcm", ".dicom")  # medical scans the scripts do not read: named in the error that finds them
LABEL_CSVS = ("labels.csv", "train.csv", "train_labels.csv")
TRAIN_DIRS = ("train", "train_images", "images/train", "train/images", "images")  # train/images: TGS Salt's
TEST_DIRS = ("test", "test_images", "images/test", "test/images")
LAYOUT_KEYS = (
    "labels_csv", "id_col", "label_col", "train_dir", "test_dir", "image_ext", "sample_submission", "submission",
    "metric",
)  # fmt: skip
IMAGE_METRICS = tasks().IMAGE_METRICS  # by what the submission holds (train.py checks --metric against it too)
# what an image submission holds (train.py's --submission), in words: auto reads the sample; positive is for
# AUC on 0/1 labels, where the sample's 0s cannot say it
IMAGE_SUBMISSIONS = {
    "auto": "from the sample",
    "probs": "a probability column per class",
    "label": "one label column",
    "positive": "one column of the second class's probability",
    "number": "the label column's score (a regression, RMSE)",
}


def _header(path: Path) -> list[str]:
    try:
        return csvfile.header(path)
    except (OSError, UnicodeDecodeError) as e:
        raise KagtplError(f"{path}: cannot read the CSV header ({e})") from e


def _first_value(path: Path, column: str) -> str | None:
    row = next(csvfile.dict_rows(path, limit=1), None)
    return None if row is None else row.get(column)


def _pick(data: Path, given: str | None, candidates, what: str, is_ok, task: str = "an image", flag: str = "") -> str:
    """The first candidate `is_ok` takes, or `given`; none is an error naming what was looked for
    (and `flag`, the option that names it)."""
    if given:
        if not is_ok(data / given):
            raise KagtplError(f"--data {data}: {what} {given!r} not found")
        return given
    for name in candidates:
        if is_ok(data / name):
            return name
    held = _not_images(data, candidates) if "image folder" in what else ""
    zips = sorted(p.name for p in data.glob("*.zip") if p.is_file())  # `kaggle competitions download` gives one
    held += f"; {data} holds {', '.join(zips[:3])}: unzip it there first" if zips else ""
    named = f"; name yours with {flag}" if flag else ""
    raise KagtplError(
        f"--data {data} does not look like {task} competition: no {what} (looked for {', '.join(candidates)}){held}"
        f"{named}"
    )


def _not_images(data: Path, candidates) -> str:
    """What a candidate image folder holds instead of images: VinBigData's train/ of .dicom files
    was "no training image folder", beside the folder itself."""
    for name in candidates:
        files = data_files(data / name)
        if files:
            ext, n = collections.Counter(p.suffix.lower() for p in files).most_common(1)[0]
            dicom = ": DICOM is not read; convert it to PNG (16-bit PNGs keep their depth)" if ext in DICOM else ""
            return f"; {name}/ holds {n} {ext} file(s), no image ({' '.join(IMAGE_EXTS)}){dicom}"
    return ""


def _pick_submission(data: Path, given: str | None, what: str, task: str) -> str:
    """sample_submission.csv, else the first *submission*.csv in any letters (titanic ships
    gender_submission.csv; Otto, Forest Cover Type and Bike Sharing sampleSubmission.csv)."""
    found = sorted(p.name for p in data.glob("*.csv") if "submission" in p.name.lower() and p.is_file())
    if not given and not found and data.is_dir():  # unzipped into a folder of its own? (listed only then:
        deeper = sorted(  # train/ may hold 100,000 images) not a project's own output/submission.csv
            p for p in data.glob("*/*.csv") if "submission" in p.name.lower() and not p.name.startswith("submission")
        )
        if deeper:
            raise KagtplError(f"--data {data} holds no submission CSV; {deeper[0].parent.name}/ holds "
                              f"{deeper[0].name}: --data {deeper[0].parent}")  # fmt: skip
    return _pick(data, given, ["sample_submission.csv", *found], what, Path.is_file, task, "--sample-submission")


def median_side(folder: Path, ext: str, limit: int = 200) -> float | None:
    """The median side (widths and heights together) of up to `limit` training images, from
    their headers (PIL reads sizes without decoding); None without PIL or without a readable image.
    An image past PIL's decompression-bomb limit (a 14000x14000 scan) is measured all the same,
    with a WARNING: the project decodes it with OpenCV, whose limit is 2**30 pixels."""
    try:
        from PIL import Image
    except ImportError:
        return None
    sides: list[int] = []
    huge: list[tuple[Path, tuple[int, int]]] = []
    limit_px, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # headers only: nothing is decoded
    try:
        for path in sampled(folder, ext, limit):
            try:
                with Image.open(path) as img:
                    sides += list(img.size)
                    if limit_px and img.size[0] * img.size[1] > limit_px:
                        huge.append((path, img.size))
            except OSError:
                continue
    finally:
        Image.MAX_IMAGE_PIXELS = limit_px
    if huge:
        (path, (w, h)) = huge[0]
        print(
            f"WARNING: {len(huge)} training image(s) over PIL's decompression-bomb limit of {limit_px / 1e6:.0f}M "
            f"pixels (first: {path}, {w}x{h}): measured from the header; decoding one takes "
            f"{w * h * 3 / 2**30:.1f} GB of memory per loader worker"
        )
    return statistics.median(sides) if sides else None


def sampled(folder: Path, ext: str, limit: int) -> list[Path]:
    """Up to `limit` of a folder's `ext` files; of class folders (train/<class>/<image>), taken from
    every class in turn: Plant Seedlings' classes differ in size (a median of the first class's
    images alone stood for all twelve)."""
    per_class = [data_files(d, f"*{ext}") for d in class_folders(folder)] or [data_files(folder, f"*{ext}")]
    in_turn = (p for row in itertools.zip_longest(*per_class) for p in row if p is not None)
    return list(itertools.islice(in_turn, limit))


def image_size(data: Path, layout: dict, profile) -> tuple[int, str]:
    """The image size for a profile from the training images of a detected layout, and why
    (`kagtpl new` records it, `kagtpl recommend --data` shows it)."""
    from kagtpl.template import hardware

    side = median_side(data / layout["train_dir"], layout["image_ext"])
    return hardware().image_size_for(profile, side)


def no_image_folder(data: Path, o: dict) -> None:
    """No training image folder where kagtpl new looks, nor class folders: an error saying what the
    candidates hold instead (DICOM scans) and, beside train.csv and test.csv, that the competition
    may be a table's or a text's (kagtpl new's task is image unless --task names another: a table's
    folder said "cannot tell the label column ...; pass --label-col")."""
    looked = [data / d for d in TRAIN_DIRS]
    if o["train_dir"] is not None or any(has_images(d, o["image_ext"]) or class_folders(d) for d in looked):
        return
    tables = all((data / name).is_file() for name in ("train.csv", "test.csv"))
    hint = "; train.csv and test.csv: a table or text? --task tabular or text" if tables else ""
    raise KagtplError(
        f"--data {data} does not look like an image competition: no training image folder (looked for "
        f"{', '.join(TRAIN_DIRS)}){_not_images(data, TRAIN_DIRS)}{hint}"
    )


def detect_image(data: Path, overrides: dict[str, str | None]) -> dict[str, str]:
    """Answers for the layout keys and --metric; `overrides` (flags) win over what is found."""
    found = image_layout(data, overrides)
    metric = overrides.get("metric")
    return found if metric is None else {**found, **image_metric(data, found, metric)}


def image_metric(data: Path, found: dict, metric: str) -> dict[str, str]:
    """--metric for an image project, checked against what the submission holds (IMAGE_METRICS):
    a sample whose one label column holds whole numbers, scored on probabilities (auc, logloss:
    Histopathologic's 0s), is the second class's probability (--submission positive) for two classes."""
    kind, sample = found["submission"], data / found["sample_submission"]
    if kind == "auto" and _header(sample)[1:] != [found["label_col"]]:
        kind = "probs"
    elif kind == "auto":
        kind = "positive" if holds_fraction(sample, found["label_col"]) else "label"
        if kind == "label" and metric in IMAGE_METRICS["positive"]:
            two_classes(data, found, metric)
            return {"submission": "positive", "metric": metric}
        if kind == "label" and metric == "qwk":  # ordered grades (APTOS's 0-4): learned as a score, handed in whole
            graded(data, found)
            return {"submission": "number", "metric": metric}
    if metric not in IMAGE_METRICS[kind]:
        raise KagtplError(
            f"--metric {metric} does not score a {kind} submission ({IMAGE_SUBMISSIONS[kind]}); use "
            f"{' or '.join(IMAGE_METRICS[kind])}"
        )
    return {"metric": metric}


def graded(data: Path, found: dict) -> None:
    """QWK's labels are grades: whole numbers in the labels CSV (class folders' names are words)."""
    values, numeric = (
        _column_values(data / found["labels_csv"], found["label_col"]) if found["labels_csv"] else (set(), False)
    )
    if not numeric or not all(_is_int(v) for v in values):
        where = f"{found['labels_csv']}'s {found['label_col']!r}" if found["labels_csv"] else "class folders"
        shown = ", ".join(sorted(values)[:3])
        raise KagtplError(
            f"--metric qwk scores ordered grades (whole numbers, APTOS's 0-4); {where} holds {shown or 'names'}"
        )


def two_classes(data: Path, found: dict, metric: str) -> None:
    """The sample's one column holds a probability for two classes only: the labels CSV's (class
    folders' count is train.py's preflight)."""
    if not found["labels_csv"]:
        return
    labels = _column_values(data / found["labels_csv"], found["label_col"])[0]
    if len(labels) != 2:
        raise KagtplError(
            f"--metric {metric} scores probabilities, but {found['sample_submission']}'s one column "
            f"{found['label_col']!r} holds one only for two classes ({found['labels_csv']} has {len(labels)})"
        )


def image_layout(data: Path, overrides: dict[str, str | None]) -> dict[str, str]:
    """The layout keys' answers; `overrides` (flags) win over what is found."""
    if not data.is_dir():
        raise KagtplError(f"--data {data}: no such folder")
    o = {k: overrides.get(k) for k in LAYOUT_KEYS}
    sample = _pick_submission(data, o["sample_submission"], "sample submission CSV", "an image")
    sample_cols = _header(data / sample)
    if len(sample_cols) < 2:
        raise KagtplError(f"{data / sample}: a sample submission needs an id column and at least one more")
    submission = image_submission(o["submission"], data / sample, sample_cols)
    no_image_folder(data, o)
    if o["labels_csv"] == "" or (o["labels_csv"] is None and not any((data / c).is_file() for c in LABEL_CSVS)):
        return {**class_folder_layout(data, o, sample, sample_cols), "submission": submission}
    labels = _pick(data, o["labels_csv"], LABEL_CSVS, "labels CSV", Path.is_file)
    label_cols = _header(data / labels)
    id_col = o["id_col"] or (sample_cols[0] if sample_cols[0] in label_cols else label_cols[0])
    if id_col not in label_cols:
        raise KagtplError(f"{data / labels}: no id column {id_col!r} (columns: {label_cols})")
    others = [c for c in label_cols if c != id_col]
    label_col = o["label_col"]
    if label_col is None:
        if len(sample_cols) == 2 and sample_cols[1] in others:
            label_col = sample_cols[1]
        elif len(others) == 1:
            label_col = others[0]
        elif len(sample_cols) > 2 and set(sample_cols[1:]) <= set(others):
            label_col = ""  # one-hot: a 0/1 column per class of the sample (Plant Pathology)
        else:
            raise KagtplError(f"{data / labels}: cannot tell the label column among {others}; pass --label-col")
    if label_col and label_col not in label_cols:
        raise KagtplError(f"{data / labels}: no label column {label_col!r} (columns: {label_cols})")
    ext = o["image_ext"]  # "" is an answer: images named by their id alone (some competitions ship them so)
    train_dir = _pick(data, o["train_dir"], TRAIN_DIRS, "training image folder", lambda p: has_images(p, ext))
    test_dir = _pick(data, o["test_dir"], TEST_DIRS, "test image folder", lambda p: has_images(p, ext))
    if ext is None:
        ext = image_ext(data / train_dir, _first_value(data / labels, id_col) or "")
    if submission == "auto" and label_col and sample_cols[1:] == [label_col]:  # the sample's one column: a label
        submission = score_submission(data / labels, label_col)
        if submission == "auto" and not holds_fraction(data / sample, label_col):
            if overrides.get("metric") is None:  # not a fraction: labels, unless --metric scores probabilities
                rare_class_warning(data / labels, label_col, "--metric auc")
    return {
        "labels_csv": labels,
        "id_col": id_col,
        "label_col": label_col,
        "train_dir": train_dir,
        "test_dir": test_dir,
        "image_ext": ext,
        "sample_submission": sample,
        "submission": submission,
    }


RARE_CLASS = 0.1  # a binary target whose rarer class is under 10% of rows: labels say the other nearly everywhere


def rare_class_warning(path: Path, column: str, flag: str, limit: int = 20000) -> None:
    """A WARNING when `column` holds two classes, the rarer in under RARE_CLASS of the first `limit`
    rows, and the submission would hold labels: the likelier class nearly everywhere (SIIM-ISIC's
    melanoma, 1.8% of images; Santander's transactions, 10%), which AUC, the usual metric with so
    rare a class, scores 0.5. `flag` is what hands in probabilities instead."""
    counts = collections.Counter((row.get(column) or "").strip() for row in csvfile.dict_rows(path, limit=limit))
    counts.pop("", None)
    if len(counts) != 2:
        return
    (common, n_common), (rare, n_rare) = counts.most_common()
    share = n_rare / (n_common + n_rare)
    if share < RARE_CLASS:
        print(
            f"WARNING: {path.name}'s {column!r} is {rare!r} in {share:.1%} of rows: labels would say {common!r} "
            f"nearly everywhere (AUC near 0.5); if the competition scores probabilities (AUC, log loss), pass {flag}"
        )


def score_submission(path: Path, label_col: str) -> str:
    """'number' (a regression) when the labels hold a fraction (a score: 0.25 is no class), else
    'auto', with a WARNING when they are more than 20 whole numbers: a score (PetFinder's
    Pawpularity 1-100) or class ids (a landmark's), which the data cannot tell apart."""
    values, numeric = _column_values(path, label_col, limit=1000)
    if not numeric or not values:
        return "auto"
    if not all(_is_int(v) for v in values):
        return "number"
    if len(values) > 20:
        shown = sorted(values, key=float)
        print(
            f"WARNING: {path.name}'s {label_col!r} holds {len(values)} whole numbers ({shown[0]} to {shown[-1]}), "
            f"each trained as a class; a score is learned as one with --submission number (a regression)"
        )
    return "auto"


def image_submission(given: str | None, sample: Path, columns: list[str]) -> str:
    """--submission for an image project (one of IMAGE_SUBMISSIONS, new.py checked; auto when not
    given), checked against the sample: one probability column is the sample's one column after the id."""
    if given is None:
        return "auto"
    if given in ("positive", "number") and len(columns) != 2:
        what = "probability" if given == "positive" else "score"
        raise KagtplError(
            f"--submission {given} writes one {what} column after the id; {sample} has {len(columns) - 1} "
            f"({', '.join(columns[1:])})"
        )
    return given


def class_folders(folder: Path) -> list[Path]:
    """The class folders of an image folder (Plant Seedlings: train/<class>/<image>): its
    subfolders holding images; none when it holds images of its own."""
    if not folder.is_dir() or any(f.suffix.lower() in IMAGE_EXTS for f in data_files(folder)):
        return []
    return [d for d in sorted(folder.iterdir()) if d.is_dir() and not d.name.startswith(".") and has_images(d, None)]


def name_classes(folder: Path) -> list[str]:
    """The classes of an image folder whose files are named <class>.<n>.<ext> (Dogs vs. Cats:
    cat.0.jpg, dog.0.jpg): at least two, and at most one for every three images (names unique
    before their first dot are ids, not classes); none otherwise."""
    names = [f.name for f in data_files(folder) if f.suffix.lower() in IMAGE_EXTS]
    if not names or any(n.count(".") < 2 for n in names):
        return []
    found = sorted({n.split(".")[0] for n in names})
    return found if 2 <= len(found) <= len(names) // 3 else []


def image_folder(folder: Path) -> Path:
    """Where a training folder without a labels CSV keeps images to name their extension by: its
    first class folder, or itself (<class>.<n> names)."""
    return next(iter(class_folders(folder)), folder)


def class_folder_layout(data: Path, o: dict, sample: str, sample_cols: list[str]) -> dict[str, str]:
    """No labels CSV: each training image's class is its folder's name, or the start of its file's
    (labels_csv ''). The id and label columns are the sample's first two (the label's only matters
    for a label submission)."""
    what = f"labels CSV ({', '.join(LABEL_CSVS)}), class folders (<class>/<image>) or <class>.<n> images"
    train_dir = _pick(data, o["train_dir"], TRAIN_DIRS, what, lambda p: class_folders(p) or name_classes(p))
    ext = o["image_ext"]
    test_dir = _pick(data, o["test_dir"], TEST_DIRS, "test image folder", lambda p: has_images(p, ext))
    if ext is None:
        ext = next((f.suffix for f in data_files(image_folder(data / train_dir)) if f.suffix.lower() in IMAGE_EXTS), "")
    label_col = o["label_col"] or (sample_cols[1] if len(sample_cols) == 2 else "label")
    return {
        "labels_csv": "",
        "id_col": o["id_col"] or sample_cols[0],
        "label_col": label_col,
        "train_dir": train_dir,
        "test_dir": test_dir,
        "image_ext": ext,
        "sample_submission": sample,
    }


def has_images(folder: Path, ext: str | None) -> bool:
    """A folder holding images: files with an image extension, or `ext`'s, or (any extension
    allowed) files with none: some competitions name images by their id alone. A folder is no
    image: TGS Salt's train/ holds only images/ and masks/, and was taken for the image folder."""
    if not folder.is_dir():
        return False
    wanted = (*IMAGE_EXTS, "") if ext is None else (ext.lower(),)  # "" given: files named by their id alone
    return any(q.suffix.lower() in wanted and not q.is_dir() for q in folder.iterdir())


def image_ext(folder: Path, first_id: str) -> str:
    """The extension of the image named after the first id: its own (an id `a.png`), one of
    IMAGE_EXTS, or none (a file named as the id). A symlink that leads nowhere or to itself is
    named as such: no --image-ext would find it."""
    if Path(first_id).suffix.lower() in IMAGE_EXTS:
        return Path(first_id).suffix
    for e in (*IMAGE_EXTS, ""):
        path = folder / f"{first_id}{e}"
        if path.is_file():
            return e
        if path.is_symlink():
            raise KagtplError(f"{path}: a symlink that leads to itself or nowhere; fix or remove it")
    raise KagtplError(f"{folder}: no image named after the first id {first_id!r}; pass --image-ext")


TABULAR_KEYS = ("train_csv", "test_csv", "sample_submission", "id_col", "target", "problem", "metric")
# the metrics each problem takes (the task registry's, which the generated train.py checks too): a table
# learns one target, so no multilabel; a text has no rmsle or mae
METRICS = {p: m for p, m in tasks().PROBLEM_METRICS.items() if p != "multilabel"}
LABEL_METRICS = ("accuracy", *tasks().LABELS_ONLY_METRICS)  # of the labels handed in, not of probabilities


def _column_values(path: Path, column: str, limit: int = 64) -> tuple[set[str], bool]:
    """Up to `limit` distinct non-empty values of a CSV column, and whether all values are numbers."""
    values, numeric = set(), True
    for row in csvfile.dict_rows(path):
        v = (row.get(column) or "").strip()
        if not v:
            continue
        if numeric:
            try:
                float(v)
            except ValueError:
                numeric = False
        if len(values) < limit:
            values.add(v)
    return values, numeric


def holds_fraction(sample: Path, column: str) -> bool:
    """The sample's label column holds a fraction (Dogs vs. Cats Redux's 0.5): a probability to fill,
    not a label (whole numbers, 0s among them, say nothing)."""
    sampled, numeric = _column_values(sample, column)
    return numeric and bool(sampled) and not all(_is_int(v) for v in sampled)


def _is_int(v: str) -> bool:
    try:
        return float(v) == int(float(v))
    except ValueError:
        return False


def _table_names(data: Path, stem: str, given: str | None) -> list[str]:
    """train.csv, else the one train*.csv there is, in any letters (LLM - Detect AI Generated Text
    ships train_essays.csv and test_essays.csv), else the one *train*.csv (Home Credit's
    application_train.csv); several of them are an error that names them."""
    tables = [p.name for p in sorted(data.glob("*.csv")) if p.is_file() and p.name != f"{stem}.csv"]
    found = [name for name in tables if name.lower().startswith(stem)]  # Train.csv too
    if not found:
        found = [name for name in tables if stem in name.lower() and "submission" not in name.lower()]
    if not given and len(found) > 1 and not (data / f"{stem}.csv").is_file():
        several = f"{len(found)} {stem}*.csv ({', '.join(found[:5])})"
        raise KagtplError(f"--data {data}: no {stem}.csv, and {several}: name one with --{stem}-csv")
    return [f"{stem}.csv", *found]


def _tables(data: Path, o: dict, task: str) -> list[tuple[str, list[str]]]:
    """(file, header) of the sample submission, train.csv and test.csv, found or as given."""
    if not data.is_dir():
        raise KagtplError(f"--data {data}: no such folder")
    sample = _pick_submission(data, o["sample_submission"], "submission CSV", task)
    train, test = (
        _pick(data, o[f"{stem}_csv"], _table_names(data, stem, o[f"{stem}_csv"]), f"{stem}.csv", Path.is_file, task,
              f"--{stem}-csv")
        for stem in ("train", "test")
    )  # fmt: skip
    return [(f, _header(data / f)) for f in (sample, train, test)]


def shown_columns(cols: list[str], most: int = 12) -> str:
    """A file's columns for an error line: all of them, or the first `most` and how many more."""
    return f"{cols[:most]}" + (f" and {len(cols) - most} more" if len(cols) > most else "")


ONE_TARGET = "a table project learns one target column; several (multi-label, multi-target) are not supported yet"


def row_numbers(sample: Path, id_col: str, test: Path) -> str:
    """'1' (or '0') when the sample's ids are the test table's row numbers counted from 1 (or 0),
    as Digit Recognizer's ImageId, a column of neither table; '' otherwise."""
    ids = [(row.get(id_col) or "").strip() for row in csvfile.dict_rows(sample)]
    if not ids or ids[0] not in ("0", "1") or ids != [str(int(ids[0]) + i) for i in range(len(ids))]:
        return ""
    return ids[0] if sum(1 for _ in csvfile.dict_rows(test)) == len(ids) else ""


def _label_column(sample_cols: list[str], train_cols: list[str], test_cols: list[str]) -> str | None:
    """The target a sample of one value column names otherwise: train.csv's column of the same name
    in other letters (Digit Recognizer's Label for label), else the one column test.csv lacks
    (Contradictory, My Dear Watson's prediction for label). Its values (labels or a probability)
    fill the sample's column; it was read as a column of class probabilities, one class."""
    if len(sample_cols) != 2 or sample_cols[1] in train_cols:
        return None
    lacking = [c for c in train_cols if c not in test_cols and c != sample_cols[0]]
    same = [c for c in lacking if c.lower() == sample_cols[1].lower()]
    return same[0] if len(same) == 1 else lacking[0] if len(lacking) == 1 else None


def top_labels(sample_values: set[str], labels: set[str]) -> bool:
    """The sample's values are each the registry's TOP_LABELS training labels, space-separated
    (Playground S5E6's `14-35-14 10-26-26 Urea`): MAP@3, not one label a row."""
    split = [v.split() for v in sample_values]
    return bool(split) and all(len(s) == tasks().TOP_LABELS and set(s) <= labels for s in split)


def check_map3(metric: str, submission: str, sample: Path) -> None:
    if metric == "map3" and submission != "label":
        raise KagtplError(f"--metric map3 hands in three labels a row, but {sample} holds a probability per class")


def detect_tabular(
    data: Path, overrides: dict[str, str | None], rule: str = ONE_TARGET, numbered: bool = True
) -> dict[str, str]:
    """Answers for a table competition: files, id and target columns, problem, submission, metric.
    A sample whose value columns are several of train.csv's (EC1, EC2) is an error that gives
    `rule`, before a project that would read EC2 as a feature (--target EC1 rendered one). Ids
    that are the test's row numbers (a column of neither table) are `row_ids` when `numbered`."""
    o = {k: overrides.get(k) for k in TABULAR_KEYS}
    (sample, sample_cols), (train, train_cols), (test, test_cols) = _tables(data, o, "a table")
    if len(sample_cols) < 2:
        raise KagtplError(f"{data / sample}: a submission template needs an id column and at least one more")
    id_col = o["id_col"] or sample_cols[0]
    row_ids = row_numbers(data / sample, id_col, data / test) if numbered and id_col not in test_cols else ""
    for name, cols in ((train, train_cols), (test, test_cols)):
        if id_col not in cols and not row_ids:
            raise KagtplError(f"{data / name}: no id column {id_col!r} (columns: {shown_columns(cols)})")
    several = [c for c in sample_cols[1:] if c in train_cols and c not in test_cols]
    if len(several) > 1:
        raise KagtplError(f"{data / sample}: {len(several)} target columns ({', '.join(several)}): {rule}")
    if o["target"] and "," in o["target"]:
        raise KagtplError(f"--target {o['target']}: {rule}")
    label_col = _label_column(sample_cols, train_cols, test_cols)
    prob_columns = len(sample_cols) > 2 or (sample_cols[1] not in train_cols and not label_col)
    target = o["target"]
    if not target:
        candidates = [c for c in train_cols if c not in test_cols and c != id_col]
        target = label_col or (
            sample_cols[1] if not prob_columns else (candidates[0] if len(candidates) == 1 else None)
        )
        if target is None:
            raise KagtplError(f"{data / train}: cannot tell the target among {candidates}; pass --target")
    if target not in train_cols:
        raise KagtplError(f"{data / train}: no target column {target!r} (columns: {shown_columns(train_cols)})")
    values, numeric = _column_values(data / train, target)
    problem = o["problem"]
    if not problem:
        if prob_columns:
            problem = "multiclass"
        elif len(values) == 2:
            problem = "binary"
        elif not numeric or (all(_is_int(v) for v in values) and len(values) <= 10):
            problem = "multiclass"
        else:
            problem = "regression"
    if problem not in METRICS:
        raise KagtplError(f"unknown problem {problem!r}; valid problems: {', '.join(METRICS)}")
    # The sample's values decide the output: numbers where the target is words (yes/no) are
    # probabilities; whole numbers for a numeric target are labels
    sample_values, sample_numeric = _column_values(data / sample, sample_cols[1])
    sample_numeric = sample_numeric and bool(sample_values)
    labels = not prob_columns and (not sample_numeric if not numeric else all(_is_int(v) for v in sample_values))
    metric = o["metric"]
    if metric and problem == "binary" and (metric in LABEL_METRICS) != labels:
        shown = sorted(sample_values)[:3]
        print(
            f"WARNING: --metric {metric} scores {'labels' if metric in LABEL_METRICS else 'probabilities'}, but "
            f"{sample}'s {sample_cols[1]!r} holds {'labels' if labels else 'numbers'} ({', '.join(shown)}): "
            f"the submission follows --metric"
        )
    if not metric and problem == "binary" and labels:
        rare_class_warning(data / train, target, "--metric auc")
    if not metric:
        metric = {
            "binary": "accuracy" if labels else "auc",
            "multiclass": "logloss" if prob_columns else "map3" if top_labels(sample_values, values) else "accuracy",
            "regression": "rmse",
        }[problem]
    if metric not in METRICS[problem]:
        raise KagtplError(
            f"metric {metric!r} does not fit a {problem} problem; use one of {', '.join(METRICS[problem])}"
        )
    submission = "probs" if prob_columns or (problem == "binary" and metric not in LABEL_METRICS) else "label"
    if problem == "regression":
        submission = "label"
    check_map3(metric, submission, data / sample)
    found = {
        "train_csv": train,
        "test_csv": test,
        "sample_submission": sample,
        "id_col": id_col,
        "target": target,
        "problem": problem,
        "submission": submission,
        "metric": metric,
    }
    return {**found, "row_ids": row_ids} if row_ids else found


TEXT_KEYS = (*TABULAR_KEYS, "text_cols")
TEXT_METRICS = {
    p: tuple(m for m in ms if m not in tasks().TABLE_ONLY_METRICS) for p, ms in tasks().PROBLEM_METRICS.items()
}
TEXT_MIN_CHARS, TEXT_MIN_WORDS = 15, 3  # a column of prose, not a category or a code


def _looks_like_text(path: Path, column: str, limit: int = 200) -> bool:
    """Mean length >= 15 characters and >= 3 words over the first `limit` non-empty values."""
    chars = words = n = 0
    for row in csvfile.dict_rows(path):
        v = (row.get(column) or "").strip()
        if not v:
            continue
        try:
            float(v)
            return False  # a number column
        except ValueError:
            pass
        chars, words, n = chars + len(v), words + len(v.split()), n + 1
        if n >= limit:
            break
    return n > 0 and chars / n >= TEXT_MIN_CHARS and words / n >= TEXT_MIN_WORDS


SCORES = "a text project learns one target column, or every score column of the sample when --target is left out"


def label_kind(path: Path, columns: list[str], limit: int = 2000) -> str:
    """What several target columns of 0s and 1s are, over the first `limit` rows: "one-hot" when
    each row holds exactly one 1 (class columns: LLM Classification Finetuning's winner_model_a,
    winner_model_b, winner_tie), "labels" when rows hold any number (Jigsaw's toxic, obscene,
    threat...: multilabel); "" when a value is another number (scores)."""
    ones = set()
    for row in csvfile.dict_rows(path, limit=limit):
        values = [(row.get(c) or "").strip() for c in columns]
        if any(v not in ("0", "1", "0.0", "1.0") for v in values):
            return ""
        ones.add(sum(float(v) for v in values))
    return "" if not ones else "one-hot" if ones == {1.0} else "labels"


def detect_text(data: Path, overrides: dict[str, str | None]) -> dict[str, str]:
    """Answers for a text competition: the table layout (as for tables), the text column(s), and
    several targets when the sample submission names several columns of train.csv: one-hot
    classes when each row holds one 1 (LLM Classification Finetuning's winners: multiclass, log
    loss; they were read as three scores, RMSE), 0/1 labels when rows hold any number of 1s
    (Jigsaw's toxic comments: multilabel, mean AUC; read as six scores until 2026-12-06), else
    regression targets (essay scores)."""
    o = {k: overrides.get(k) for k in TEXT_KEYS}
    (sample, sample_cols), (train, train_cols), (test, test_cols) = _tables(data, o, "a text")
    scores = [c for c in sample_cols[1:] if c in train_cols and c not in test_cols]
    if len(sample_cols) > 2 and len(scores) == len(sample_cols) - 1 and not o["target"]:
        kind = label_kind(data / train, scores)
        problem, metric = {"one-hot": ("multiclass", "logloss"), "labels": ("multilabel", "auc")}.get(
            kind, ("regression", "rmse")
        )
        found = {
            "train_csv": train,
            "test_csv": test,
            "sample_submission": sample,
            "id_col": o["id_col"] or sample_cols[0],
            "target": ",".join(scores),
            "problem": o["problem"] or problem,
            "submission": "probs" if kind else "label",
            "metric": metric,
        }
        if found["problem"] != problem:
            what = {"one-hot": "one-hot classes", "labels": "0/1 labels"}.get(kind, "scores")
            raise KagtplError(
                f"{data / sample}: {len(scores)} target columns of {what}: a {problem} problem; drop --problem"
            )
    elif o["problem"] == "multilabel":
        why = "leave --target out" if o["target"] else f"it names no 0/1 label columns of {train} that {test} lacks"
        raise KagtplError(f"--problem multilabel learns the label columns of {data / sample}: {why}")
    else:
        found = detect_tabular(data, {**o, "metric": None}, SCORES, numbered=False)
        if found["metric"] == "rmsle":
            found["metric"] = "rmse"
    if o["metric"]:
        found["metric"] = o["metric"]
    check_map3(found["metric"], found["submission"], data / found["sample_submission"])
    if found["metric"] not in TEXT_METRICS[found["problem"]]:
        raise KagtplError(
            f"metric {found['metric']!r} does not fit a {found['problem']} text problem; use one of "
            f"{', '.join(TEXT_METRICS[found['problem']])}"
        )
    targets = found["target"].split(",")
    text_cols = o["text_cols"]
    if text_cols:
        for c in text_cols.split(","):
            if c not in train_cols or c not in test_cols:
                raise KagtplError(f"--text-cols {c}: not a column of both {train} and {test}")
    else:
        common = [c for c in train_cols if c in test_cols and c != found["id_col"] and c not in targets]
        texts = [c for c in common if _looks_like_text(data / train, c)]
        if not texts:
            raise KagtplError(f"{data / train}: no text column among {shown_columns(common)}; pass --text-cols")
        text_cols = ",".join(texts)
    return {**found, "text_cols": text_cols}


# ----------------------------------------------------------------------------- segmentation

SEGMENTATION_KEYS = (
    "train_dir", "test_dir", "image_ext", "mask_dir", "mask_ext", "mask_values", "missing_mask", "train_csv", "id_col",
    "rle_col", "class_col", "rle_order", "rle_start", "sample_submission", "metric", "arch",
)  # fmt: skip
RLE_PAIRS = re.compile(r"\d+ \d+( \d+ \d+)*")
MASK_DIRS = ("train_masks", "masks", "train_mask", "train_labels", "labels", "images/masks", "train/masks")
RLE_CSVS = ("train.csv", "train_rle.csv", "train_masks.csv", "train_labels.csv")
MASK_EXTS = (*IMAGE_EXTS, ".gif")  # what masks.read_mask (PIL) reads: Carvana's masks are <id>_mask.gif


def has_masks(folder: Path) -> bool:
    return any(p.suffix.lower() in MASK_EXTS for p in data_files(folder))


def mask_suffix(masks: list[Path], stems: set[str]) -> str | None:
    """What each mask file's name adds to its image's stem: '.png' for img1.png, '_mask.gif' for
    Carvana's img1_mask.gif: the most common over up to 50 masks, each read against the longest
    image stem it starts with; None when no mask starts with one."""
    tails: dict[str, int] = {}
    for mask in masks[:50]:
        name = mask.name
        cut = next((k for k in range(len(name) - 1, 0, -1) if name[:k] in stems), None)
        if cut is not None:
            tails[name[cut:]] = tails.get(name[cut:], 0) + 1
    return max(tails, key=tails.get) if tails else None


def mask_values(folder: Path, limit: int = 50) -> str:
    """The values besides background 0 in up to `limit` mask files, comma-separated ('255' for
    0/255 masks, '1,2,3' for class indices, '65535' for 16-bit 0/65535 masks, which were skipped
    unread and said '255'); '255' when every one read is empty."""
    from PIL import Image

    found: set[int] = set()
    for path in data_files(folder)[:limit]:
        try:
            with Image.open(path) as img:
                band = img.convert("L") if img.mode == "1" else img.getchannel(0) if len(img.getbands()) > 1 else img
                band = band.convert("I") if band.mode.startswith("I;") else band  # 16-bit: getcolors takes I
                found |= {int(v) for _, v in band.getcolors(maxcolors=1 << 16) or []}
        except (OSError, ValueError):
            continue
    found.discard(0)
    return ",".join(str(v) for v in sorted(found)) or "255"


def _rle_start(path: Path, column: str) -> str:
    """'0' when a run of the first rows starts at pixel 0 (0-indexed RLE), else '1'."""
    for row in csvfile.dict_rows(path, limit=500):
        numbers = (row.get(column) or "").split()
        if numbers[0::2] and "0" in numbers[0::2]:
            return "0"
    return "1"


def one_mask_extra_column(path: Path, columns: list[str]) -> KagtplError:
    """A sample of 3 columns where the masks give one per image (id, rle): the third cannot be filled."""
    return KagtplError(
        f"{path}: columns {columns}, but the masks are one per image (id, rle): a third column cannot be filled "
        "from them; remove it from the sample, or give the class masks (--mask-values, --class-col)"
    )


def _holds_rle(path: Path, column: str, limit: int = 50) -> bool:
    """The first `limit` non-empty values of `column` are run-length pairs ("start length ...")."""
    values = [v for row in csvfile.dict_rows(path, limit=limit * 4) if (v := (row.get(column) or "").strip())]
    return bool(values) and all(RLE_PAIRS.fullmatch(v) for v in values[:limit])


def detect_segmentation(data: Path, overrides: dict[str, str | None]) -> dict[str, str]:
    """Answers for the segmentation keys: the images, masks as files or as RLE in a CSV, and the
    submission's shape; `overrides` (flags) win over what is found."""
    if not data.is_dir():
        raise KagtplError(f"--data {data}: no such folder")
    o = {k: overrides.get(k) for k in SEGMENTATION_KEYS}
    sample = _pick_submission(data, o["sample_submission"], "sample submission CSV", "a segmentation")
    sample_cols = _header(data / sample)
    if len(sample_cols) not in (2, 3):
        raise KagtplError(
            f"{data / sample}: a mask submission has columns id, rle or id, class, rle (found {sample_cols})"
        )
    ext = o["image_ext"]
    train_dir = _pick(
        data, o["train_dir"], TRAIN_DIRS, "training image folder", lambda p: has_images(p, ext), "a segmentation"
    )
    test_dir = _pick(
        data, o["test_dir"], TEST_DIRS, "test image folder", lambda p: has_images(p, ext), "a segmentation"
    )
    if ext is None:
        ext = next((p.suffix for p in sorted((data / train_dir).iterdir()) if p.suffix.lower() in IMAGE_EXTS), "")
    found = {"train_dir": train_dir, "test_dir": test_dir, "image_ext": ext, "sample_submission": sample}
    found.update({k: o[k] for k in ("rle_order", "missing_mask", "metric", "arch") if o[k] is not None})
    mask_dir = o["mask_dir"]
    if mask_dir is None and not o["train_csv"]:
        mask_dir = next((d for d in MASK_DIRS if has_images(data / d, None) or has_masks(data / d)), None)
    if mask_dir:
        if not (data / mask_dir).is_dir():
            raise KagtplError(f"--data {data}: mask folder {mask_dir!r} not found")
        found_masks = data_files(data / mask_dir)
        stems = {p.name[: len(p.name) - len(ext)] for p in data_files(data / train_dir, f"*{ext}")}
        first = found_masks[0].suffix if found_masks else ".png"
        mask_ext = o["mask_ext"] or mask_suffix(found_masks, stems) or first
        values = o["mask_values"] or mask_values(data / mask_dir)
        if len(sample_cols) == 3 and len(str(values).split(",")) == 1:
            raise one_mask_extra_column(data / sample, sample_cols)
        return {**found, "mask_dir": mask_dir, "mask_ext": mask_ext, "mask_values": values}
    if not o["train_csv"] and not any((data / name).is_file() for name in RLE_CSVS):
        raise KagtplError(
            f"--data {data} does not look like a segmentation competition: no mask folder ({', '.join(MASK_DIRS)}) "
            f"or RLE CSV ({', '.join(RLE_CSVS)}); name yours with --mask-dir or --train-csv"
        )
    csv = _pick(data, o["train_csv"], RLE_CSVS, "RLE CSV", Path.is_file, "a segmentation")
    cols = _header(data / csv)
    id_col = o["id_col"] or (sample_cols[0] if sample_cols[0] in cols else cols[0])
    runs = [c for c in sample_cols[1:] if c in cols and _holds_rle(data / csv, c)]  # Severstal's RLE is 2nd of 3
    rle_col = o["rle_col"] or (runs[0] if len(runs) == 1 else sample_cols[-1] if sample_cols[-1] in cols else cols[-1])
    class_col = o["class_col"]
    if class_col is None:  # id, class, rle (or id, rle, class): never the RLE column itself
        middle = next((c for c in sample_cols[1:] if c != rle_col), "") if len(sample_cols) == 3 else ""
        class_col = middle if middle in cols else ""
    for what, col in (("id", id_col), ("RLE", rle_col), ("class", class_col)):
        if col and col not in cols:
            raise KagtplError(f"{data / csv}: no {what} column {col!r} (columns: {cols})")
    if len(sample_cols) == 3 and not class_col:
        raise one_mask_extra_column(data / sample, sample_cols)
    start = o["rle_start"] or _rle_start(data / csv, rle_col)
    return {
        **found, "mask_dir": "", "train_csv": csv, "id_col": id_col, "rle_col": rle_col, "class_col": class_col,
        "rle_start": int(start),
    }  # fmt: skip


# ----------------------------------------------------------------------------- detection

DETECTION_KEYS = (
    "train_dir", "test_dir", "image_ext", "train_csv", "id_col", "box_cols", "box_format", "box_scale", "label_col",
    "box_classes", "missing_boxes", "sample_submission", "pred_style", "pred_fields", "pred_scale", "metric", "arch",
)  # fmt: skip
BOX_CSVS = ("train.csv", "train_labels.csv", "train_boxes.csv", "annotations.csv", "labels.csv")
CORNER_COLS = (("x_min", "y_min", "x_max", "y_max"), ("xmin", "ymin", "xmax", "ymax"), ("x1", "y1", "x2", "y2"))
WIDTH_COLS = (("x", "y", "w", "h"), ("x", "y", "width", "height"), ("left", "top", "width", "height"))
CENTRE_COLS = (("x_center", "y_center", "width", "height"), ("cx", "cy", "w", "h"))
BOX_LIST_COLS = ("bbox", "bboxes", "boxes", "box", "annotations", "PredictionString")
LABEL_COLS = ("class_name", "label", "class", "category", "class_id", "category_id", "labels")
SCORE_COLS = ("score", "confidence", "conf", "probability", "prob")
BOX_FIELDS = {"xyxy": ("x1", "y1", "x2", "y2"), "xywh": ("x", "y", "w", "h"), "cxcywh": ("cx", "cy", "w", "h")}


def _box_columns(cols: list[str], path: Path) -> tuple[str, str]:
    """(box_cols, box_format) from the column names: four coordinate columns, or one holding boxes."""
    for fmt, sets in (("xyxy", CORNER_COLS), ("xywh", WIDTH_COLS), ("cxcywh", CENTRE_COLS)):
        for names in sets:
            if all(n in cols for n in names):
                return ",".join(names), fmt
    for name in BOX_LIST_COLS:
        if name in cols:
            return name, "xywh"  # COCO's order, the usual one of a bbox column
    raise KagtplError(f"{path}: no box columns (x_min..y_max, x y w h, or a bbox column); pass --box-cols")


def _box_numbers(path: Path, box_cols: str, limit: int = 500) -> list[list[float]]:
    """The first rows' boxes as numbers (groups of four), for the scale and format checks."""
    import ast
    import json

    cols, out = box_cols.split(","), []
    for row in csvfile.dict_rows(path, limit=limit):
        try:
            if len(cols) == 4:
                out.append([float(row[c]) for c in cols])
                continue
            text = (row.get(cols[0]) or "").strip()
            dicts = text.replace(" ", "").startswith("[{")  # a Python literal: read, never run
            values = ast.literal_eval(text) if dicts else json.loads(text) if text.startswith("[") else text.split()
            if values and isinstance(values[0], dict):  # the Great Barrier Reef's [{'x': .., 'width': ..}]
                values = [[d["x"], d["y"], d.get("width", d.get("w")), d.get("height", d.get("h"))] for d in values]
            flat = [float(v) for v in (sum(values, []) if values and isinstance(values[0], list) else values)]
            out += [flat[i : i + 4] for i in range(0, len(flat) - 3, 4)]
        except (ValueError, TypeError, KeyError, SyntaxError, RecursionError, MemoryError):
            continue  # not boxes: train.py's preflight names the row
    return out


def _pred_fields(data: Path, sample: str, label_col: str, box_format: str) -> str:
    """The prediction string's groups: 5 values in the sample's strings are score + box, 6 are
    label + score + box; an empty sample: a label first when the boxes have one."""
    box = {"xywh": "x y w h", "xyxy": "x1 y1 x2 y2", "cxcywh": "cx cy w h"}[box_format]
    col = _header(data / sample)[-1]
    for row in csvfile.dict_rows(data / sample, limit=50):
        n = len((row.get(col) or "").split())
        if n and n % 6 == 0 and n % 5:
            return f"label score {box}"
        if n and n % 5 == 0:
            return f"score {box}"
    return f"{'label ' if label_col else ''}score {box}"


def _row_fields(path: Path, sample_cols: list[str]) -> str:
    """A row-per-box submission's fields: each column after the id read as a box coordinate (by
    the names the training CSV's box columns go by), a score or a label."""
    names, fmt = _box_columns(sample_cols[1:], path)
    if names.count(",") != 3:
        raise KagtplError(f"{path}: a row-per-box submission needs four box columns (x_min..y_max, x y w h, ...)")
    role = dict(zip(names.split(","), BOX_FIELDS[fmt], strict=True))
    fields = []
    for col in sample_cols[1:]:
        if col not in role and col.lower() not in SCORE_COLS and col not in LABEL_COLS:
            raise KagtplError(f"{path}: column {col!r} is not a box coordinate, a score or a label; pass --pred-fields")
        fields.append(role.get(col) or ("score" if col.lower() in SCORE_COLS else "label"))
    return " ".join(fields)


def detect_detection(data: Path, overrides: dict[str, str | None]) -> dict[str, str]:
    """Answers for the detection keys: the images, the training boxes' CSV and its layout (a row
    per box or per image, the columns, the format and scale), the labels, and the submission's
    prediction string; `overrides` (flags) win over what is found."""
    if not data.is_dir():
        raise KagtplError(f"--data {data}: no such folder")
    o = {k: overrides.get(k) for k in DETECTION_KEYS}
    sample = _pick_submission(data, o["sample_submission"], "sample submission CSV", "a detection")
    sample_cols = _header(data / sample)
    style = o["pred_style"] or ("rows" if len(sample_cols) > 2 else "string")
    if (style == "string") != (len(sample_cols) == 2):
        raise KagtplError(
            f"{data / sample}: columns {sample_cols}: a prediction string per image needs id, PredictionString; "
            "a row per box needs the id and the box's columns"
        )
    ext = o["image_ext"]
    train_dir = _pick(
        data, o["train_dir"], TRAIN_DIRS, "training image folder", lambda p: has_images(p, ext), "a detection"
    )
    test_dir = _pick(data, o["test_dir"], TEST_DIRS, "test image folder", lambda p: has_images(p, ext), "a detection")
    if ext is None:
        ext = next((p.suffix for p in sorted((data / train_dir).iterdir()) if p.suffix.lower() in IMAGE_EXTS), "")
    csv = _pick(data, o["train_csv"], BOX_CSVS, "training boxes CSV", Path.is_file, "a detection")
    cols = _header(data / csv)
    id_col = o["id_col"] or (sample_cols[0] if sample_cols[0] in cols else cols[0])
    box_cols, box_format = _box_columns(cols, data / csv) if not o["box_cols"] else (o["box_cols"], "xywh")
    for col in [id_col, *box_cols.split(",")]:
        if col not in cols:
            raise KagtplError(f"{data / csv}: no column {col!r} (columns: {cols})")
    numbers = _box_numbers(data / csv, box_cols)
    relative = bool(numbers) and max(max(abs(v) for v in b) for b in numbers) <= 1.0
    if relative and box_format == "xywh" and any(b[0] + b[2] > 1.0001 or b[1] + b[3] > 1.0001 for b in numbers):
        box_format = "cxcywh"  # x + w past the right edge: the first two are a centre (YOLO's)
    box_format = o["box_format"] or box_format
    box_scale = o["box_scale"] or ("relative" if relative else "pixel")
    label_col = o["label_col"] if o["label_col"] is not None else next((c for c in LABEL_COLS if c in cols), "")
    if label_col and label_col not in cols:
        raise KagtplError(f"{data / csv}: no label column {label_col!r} (columns: {cols})")
    classes = o["box_classes"]
    if classes is None and label_col:
        classes = ",".join(box_labels(data / csv, label_col, box_cols))
    found = {
        "train_dir": train_dir, "test_dir": test_dir, "image_ext": ext, "train_csv": csv, "id_col": id_col,
        "box_cols": box_cols, "box_format": box_format, "box_scale": box_scale, "label_col": label_col,
        "sample_submission": sample, "pred_style": style,
        "pred_fields": o["pred_fields"] or (
            _row_fields(data / sample, sample_cols)
            if style == "rows"
            else _pred_fields(data, sample, label_col, box_format)
        ),
        "pred_scale": o["pred_scale"] or box_scale,
    }  # fmt: skip
    if label_col:
        found["box_classes"] = classes or ""
    spaced = [c for c in (classes or "").split(",") if c != "".join(c.split())]
    if style != "rows" and "label" in re.findall(r"\w+", found["pred_fields"]) and spaced:
        raise KagtplError(
            f"{data / csv}: label {spaced[0]!r} holds a space, and the prediction string separates its fields with "
            "spaces, so it could not be written there; rename the label"
        )
    found.update({k: o[k] for k in ("missing_boxes", "metric", "arch") if o[k] is not None})
    return found


def box_labels(path: Path, label_col: str, box_cols: str) -> list[str]:
    """The labels of the rows that hold a box, in order of first appearance (a negative row's
    label, VinBigData's 'No finding', is not a class)."""
    cols, seen = box_cols.split(","), {}
    for row in csvfile.dict_rows(path):
        if any((row.get(c) or "").strip() not in ("", "[]") for c in cols):
            seen.setdefault(row.get(label_col) or "", None)
    if any("," in name for name in seen):
        raise KagtplError(f"{path}: a label holds a comma ({next(n for n in seen if ',' in n)!r}); rename it")
    return sorted(seen, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))
