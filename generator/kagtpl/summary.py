"""What `kagtpl new` detected and chose, in a few lines, each with the flag that changes it.

Read back from the rendered project's answers (what the scripts will really use) and its data
folder: a wrong guess (the id column taken for the target, 2 classes where there are 10) shows
before training, not after it."""

from __future__ import annotations

import statistics
from pathlib import Path

from kagtpl import csvfile
from kagtpl.detect import IMAGE_EXTS, IMAGE_SUBMISSIONS
from kagtpl.paths import data_files

SHOWN_CLASSES = 5  # class names shown before "..."
TEXT_SAMPLE = 2000  # rows read for the text lengths


def lines(answers: dict) -> list[str]:
    data = Path(str(answers.get("data_dir", "")))
    task = answers.get("task", "image")
    if not data.is_dir():
        found = [f"data: {data} is not on this machine (read there when the scripts run)  [--data]"]
    else:
        lines_of = {
            "image": image_lines,
            "tabular": table_lines,
            "text": text_lines,
            "segmentation": mask_lines,
            "detection": box_lines,
            "audio": audio_lines,
        }
        found = lines_of[task](data, answers)
    return ["Detected and chosen:", *(f"  {line}" for line in [*found, *plan_lines(answers)])]


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """A CSV's header and data rows (quoted newlines in texts kept whole); empty when unreadable."""
    try:
        head, rows = csvfile.read(path)
        return head, list(rows)
    except OSError:
        return [], []


def column(table: tuple[list[str], list[list[str]]], name: str) -> list[str]:
    """One column's values from read_csv's (header, rows); [] when there is no such column."""
    head, body = table
    if name not in head:
        return []
    i = head.index(name)
    return [row[i] if i < len(row) else "" for row in body]


def classes_text(values: list[str]) -> str:
    names = sorted(set(values))
    shown = ", ".join(names[:SHOWN_CLASSES]) + (", ..." if len(names) > SHOWN_CLASSES else "")
    return f"{len(names)} ({shown})"


def count_files(folder: Path, ext: str) -> int:
    return len(data_files(folder, f"*{ext}"))


def count_images(*folders: Path, ext: str) -> str:
    """The images of `folders`: those under `ext`, and those under other image extensions, which
    the scripts read as they are (a test/ of .png beside a train/ of .jpg: "297 (.png: read as they
    are)"; ids that name their own, im5.jpg among .png files: "300 (43 .jpg: read as they are)").
    One listing a folder; a name ends with `ext` as count_files' glob matches it (ext '', images
    named by their id alone: every file)."""
    files = [p for f in folders for p in data_files(f)]
    found = sum(p.name.endswith(ext) for p in files)
    other = [p.suffix for p in files if not p.name.endswith(ext) and p.suffix.lower() in IMAGE_EXTS]
    if not other:
        return str(found)
    kinds = ", ".join(sorted(set(other)))
    return (
        f"{len(other)} ({kinds}: read as they are)"
        if not found
        else f"{found + len(other)} ({len(other)} {kinds}: read as they are)"
    )


def audio_lines(data: Path, a: dict) -> list[str]:
    from kagtpl.detect_audio import AUDIO_EXTS

    train = sum(1 for p in data_files(data / a["train_dir"], deep=True) if p.suffix.lower() in AUDIO_EXTS)
    test = sum(1 for p in data_files(data / a["test_dir"]) if p.suffix.lower() in AUDIO_EXTS)
    labels = (
        f"labels: {a['train_csv']}, file column {a['file_col']!r}, label column {a['label_col']!r}, secondary "
        f"{a['secondary_col'] or 'none'!r}  [--train-csv --label-col]"
        if a.get("train_csv")
        else f"labels: each clip's folder in {a['train_dir']}/ (<label>/<clip>)  [--train-csv]"
    )
    sample = read_csv(data / a["sample_submission"])
    test_rows = "a row per window (<recording>_<end second>)" if a["test_layout"] == "windows" else "a row per clip"
    return [
        f"audio: {train} training clips in {a['train_dir']}/, {test} test recordings in {a['test_dir']}/, "
        f"{test_rows}  [--train-dir --test-dir]",
        labels,
        f"labels scored: {len(sample[0]) - 1} columns of {a['sample_submission']}, metric {a['metric']}  [--metric]",
        f"model: {a['model']} on log-mel spectrograms of {a['window_seconds']} s at {a['sample_rate']} Hz  [--model]",
    ]


def image_lines(data: Path, a: dict) -> list[str]:
    test = count_images(data / a["test_dir"], ext=a["image_ext"])
    train, labels, classes = image_labels(data, a)
    return [
        f"images: {train} in {a['train_dir']}/, {test} in {a['test_dir']}/ ({a['image_ext']}), trained at "
        f"{a['image_size']} px  [--train-dir --test-dir --image-ext --image-size]",
        f"labels: {labels}  [--labels-csv --id-col --label-col]",
        f"classes: {classes}",
        f"submission: {image_submission(data, a)}; metric {image_metric(a)}  [--submission --metric]",
        f"model: {a['model']}, "
        + (
            "from ImageNet weights (offline: train.py --weights FILE, or --no-pretrained)"
            if a.get("pretrained")
            else "from random weights (train.py --pretrained --weights FILE starts from ImageNet's)"
        )
        + "  [--model]",
    ]


def image_submission(data: Path, a: dict) -> str:
    """What submission.csv will hold: the answer, or (auto) what train.py reads from the sample."""
    kind = a.get("submission", "auto")
    if kind != "auto":
        return f"{kind}: {IMAGE_SUBMISSIONS[kind]}"
    columns = read_csv(data / a["sample_submission"])[0]
    if len(columns) > 2:
        return f"auto: {IMAGE_SUBMISSIONS['probs']} (the sample's columns)"
    return (
        f"auto: the sample's {columns[1]!r} holds a label, or the second class's probability where it holds a "
        "fraction (0/1 labels scored by AUC: --metric auc)"
    )


def image_metric(a: dict) -> str:
    """The image project's metric, in words: auto is the submission's own."""
    metric = a.get("metric", "auto")
    if metric == "auc":
        return "auc (each class's ROC AUC, averaged; two classes: the positive's)"
    if metric == "qwk":
        return "qwk (quadratic weighted kappa: the grades learned as a score, handed in rounded)"
    return "auto (log loss on probabilities, accuracy on labels, RMSE on a score)" if metric == "auto" else metric


def image_labels(data: Path, a: dict) -> tuple[str, str, str]:
    """(training images, where their labels are, the classes) for the image layouts: a label
    column, one-hot columns (label_col ''), or class folders (labels_csv '')."""
    if not a["labels_csv"]:
        from kagtpl.detect import class_folders, name_classes

        folders = class_folders(data / a["train_dir"])
        if not folders:  # <class>.<n>.<ext>
            where = f"the start of each file's name in {a['train_dir']}/ (<class>.<n>), id column {a['id_col']!r}"
            names = name_classes(data / a["train_dir"])
            return count_images(data / a["train_dir"], ext=a["image_ext"]), where, f"{classes_text(names)}  [the names]"
        images = count_images(*folders, ext=a["image_ext"])
        where = f"class folders of {a['train_dir']}/ (<class>/<image>), id column {a['id_col']!r}"
        return images, where, f"{classes_text([d.name for d in folders])}  [the folders' names]"
    labels = read_csv(data / a["labels_csv"])
    train = count_images(data / a["train_dir"], ext=a["image_ext"])
    where = f"{a['labels_csv']}, id column {a['id_col']!r}, " + (
        f"label column {a['label_col']!r}, " if a["label_col"] else "one-hot (a 0/1 column per class), "
    )
    if a.get("submission") == "number":
        values = sorted({float(v) for v in column(labels, a["label_col"]) if v.strip()})
        classes = f"none: a score from {values[0]:g} to {values[-1]:g}, learned as a regression  [--submission]"
    elif a["label_col"]:
        classes = f"{classes_text(column(labels, a['label_col']))}  [from the label column]"
    else:
        classes = f"{classes_text(read_csv(data / a['sample_submission'])[0][1:])}  [the sample's columns]"
    return train, f"{where}{len(labels[1])} rows", classes


def mask_lines(data: Path, a: dict) -> list[str]:
    train, test = (
        count_files(data / a["train_dir"], a["image_ext"]),
        count_images(data / a["test_dir"], ext=a["image_ext"]),
    )
    if a.get("mask_dir"):
        values = str(a.get("mask_values", ""))
        kind = "binary" if "," not in values else f"{len(values.split(','))} classes"
        named, flags = f"<id>{a.get('mask_ext', '')}", "[--mask-dir --mask-ext --mask-values]"
        masks = f"masks: files in {a['mask_dir']}/ ({named}, {kind}, values {values})  {flags}"
    else:
        by_class = f", class column {a['class_col']!r}" if a.get("class_col") else " (binary)"
        masks = (
            f"masks: RLE in {a['train_csv']}, column {a['rle_col']!r}{by_class}, pixels from {a['rle_start']} in "
            f"{'column' if a['rle_order'] == 'F' else 'row'}-major order  "
            "[--train-csv --rle-col --class-col --rle-start --rle-order]"
        )
    tiles = "whole" if a["image_size"] >= a["work_size"] else f"in {a['image_size']} px tiles"
    return [
        f"images: {train} in {a['train_dir']}/, {test} in {a['test_dir']}/ ({a['image_ext']}), resized to "
        f"{a['work_size']} px, trained {tiles}  [--train-dir --test-dir --image-ext --work-size --image-size]",
        masks,
        f"model: {a['arch']} with a {a['model']} encoder, metric {a['metric']} per image  [--arch --model --metric]",
    ]


def box_lines(data: Path, a: dict) -> list[str]:
    train = count_files(data / a["train_dir"], a["image_ext"])
    if a.get("pred_style") == "rows":  # train.py takes the test ids from test/'s --image-ext files alone
        test = str(count_files(data / a["test_dir"], a["image_ext"]))
    else:  # by the sample's ids, each read under another image type too (images.other_extension)
        test = count_images(data / a["test_dir"], ext=a["image_ext"])
    labels = f"labels {a['label_col']!r}: {a.get('box_classes', '')}" if a.get("label_col") else "one class"
    negatives = "an image with no row has no object" if a["missing_boxes"] == "empty" else "images with no row skipped"
    if a.get("pred_style") == "rows":
        submission = f"a row per box, columns after the id '{a['pred_fields']}' ({a['pred_scale']})"
    else:
        submission = f"'{a['pred_fields']}' groups ({a['pred_scale']}) per image"
    return [
        f"images: {train} in {a['train_dir']}/, {test} in {a['test_dir']}/ ({a['image_ext']}), resized to "
        f"{a['image_size']} px  [--train-dir --test-dir --image-ext --image-size]",
        f"boxes: {a['train_csv']} columns {a['box_cols']!r} ({a['box_format']}, {a['box_scale']}), {labels}; "
        f"{negatives}  [--train-csv --box-cols --box-format --box-scale --label-col --box-classes --missing-boxes]",
        f"submission: {submission}  [--pred-style --pred-fields --pred-scale]",
        f"model: {a['arch']} on a {a['model']} backbone, metric {a['metric']}  [--arch --model --metric]",
    ]


def metric_note(metric: str, problem: str, train: tuple, target: str) -> str:
    """What the metric scores, where its name alone does not say: each label's (multilabel), three
    classes a row (MAP@3), or one class's labels (F1: the second class, as train.py orders them)."""
    if problem == "multilabel":
        return " (each label's, averaged)"
    if metric == "map3":
        return " (MAP@3: the three likeliest classes a row)"
    if metric == "f1" and problem == "binary":
        return f" (F1 of class {sorted(set(column(train, target)))[-1]!r}, on the labels handed in)"
    return ""


def table_facts(data: Path, a: dict, train: tuple) -> list[str]:
    """Rows, columns, id, target, problem and metric; `train` is read_csv's train.csv."""
    head, body = train
    target = a["target"]
    problem = a["problem"]
    targets = target.split(",")
    if problem == "regression":
        kind = "a number" if len(targets) == 1 else f"{len(targets)} numbers a row"
    elif problem == "multilabel":  # each its own probability; the metric is each label's, averaged
        shown = ", ".join(targets[:5]) + (", ..." if len(targets) > 5 else "")
        kind = f"{len(targets)} 0/1 labels ({shown}), any number of them a row"
    else:  # several: one-hot class columns (a row's class is its column holding 1)
        kind = (
            f"classes {classes_text(targets)}, one-hot"
            if len(targets) > 1
            else f"classes {classes_text(column(train, target))}"
        )
    per_label = metric_note(a["metric"], problem, train, target)
    numbered = f" (the rows' numbers from {a['row_ids']}: a column of neither table)" if a.get("row_ids") else ""
    return [
        f"table: {a['train_csv']} {len(body)} rows x {len(head)} columns, {a['test_csv']} "
        f"{len(read_csv(data / a['test_csv'])[1])} rows  [--train-csv --test-csv]",
        f"columns: id {a['id_col']!r}{numbered}, target {target!r}  [--id-col --target]",
        f"problem: {problem}, {kind}; metric {a['metric']}{per_label}  [--problem --metric]",
    ]


def table_lines(data: Path, a: dict) -> list[str]:
    return [
        *table_facts(data, a, read_csv(data / a["train_csv"])),
        "models: LightGBM, XGBoost and CatBoost (those installed), then an MLP, blended on out-of-fold "
        "predictions  [train.py --models]",
    ]


def text_lines(data: Path, a: dict) -> list[str]:
    train = read_csv(data / a["train_csv"])
    cols = [c for c in str(a.get("text_cols", "")).split(",") if c]
    texts = [" ".join(parts) for parts in zip(*(column(train, c)[:TEXT_SAMPLE] for c in cols), strict=False)]
    words = [len(t.split()) for t in texts] or [0]
    return [
        *table_facts(data, a, train),
        f"texts: columns {', '.join(cols)}; median {statistics.median(words):.0f} words, longest {max(words)} "
        f"(first {TEXT_SAMPLE} rows)  [--text-cols]",
        f"model: {model_folder(a.get('model_dir'))}, read offline  [--model-dir]",
    ]


def model_folder(path: str | None) -> str:
    if not path:
        return "no Hugging Face folder given"
    return f"the Hugging Face folder {path}" + ("" if Path(path).is_dir() else " (not on this machine)")


def plan_lines(a: dict) -> list[str]:
    batch = a.get("batch_size") or f"from the {a['gpu']} profile's rule"
    budget = f"budget {a['budget']}" if a.get("budget") else "no budget (9h on Kaggle; run.py --budget fits the plan)"
    slug = a.get("competition") or "none named (kagtpl kaggle will need one)"
    return [
        f"plan: {a['folds']} folds x {a['epochs']} epochs, batch {batch}, {budget}  "
        "[--folds --epochs --batch-size --gpu --budget]",
        f"competition: {slug}  [--competition]",
    ]
