"""`kagtpl new` says what it detected and chose, each with the flag that changes it: one render
per task through the real CLI (Typer's runner, Copier's run_copy)."""

from __future__ import annotations

import re
from pathlib import Path

import textdata
from typer.testing import CliRunner

from kagtpl import demo, table
from kagtpl.cli import app


def new(tmp_path, *args):
    result = CliRunner().invoke(app, ["new", *args, "--dest", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = result.output.split("Detected and chosen:\n", 1)[1].split("Created ", 1)[0]
    return dict(re.findall(r"^  (\w+): (.*)$", summary, re.M))


def test_an_image_competition_names_its_columns_classes_model_and_plan(tmp_path):
    data = demo.write_digits(tmp_path / "digits", n_train=60, n_test=10)
    said = new(tmp_path, "img", "--task", "image", "--gpu", "t4", "--data", str(data), "--folds", "3")
    assert said["images"].startswith("60 in train/, 10 in test/ (.jpg), trained at 32 px  [--train-dir")
    assert said["labels"].startswith("labels.csv, id column 'id', label column 'breed', 60 rows  [--labels-csv")
    assert said["classes"].startswith("10 (eight, five, four, nine, one, ...)")
    auto = "metric auto (log loss on probabilities, accuracy on labels, RMSE on a score)  [--submission --metric]"
    assert said["submission"] == f"auto: a probability column per class (the sample's columns); {auto}"
    assert said["model"].startswith("efficientnet_b4, from ImageNet weights (offline: train.py --weights")
    assert said["plan"].startswith("3 folds x 10 epochs, batch from the t4 profile's rule, budget 9h  [--folds")
    assert said["competition"] == "none named (kagtpl kaggle will need one)  [--competition]"
    for jpg in (data / "test").glob("*.jpg"):  # a test/ of another image type than train/'s, as some competitions ship
        jpg.rename(jpg.with_suffix(".png"))
    said = new(tmp_path, "png", "--task", "image", "--gpu", "t4", "--data", str(data))
    assert said["images"].startswith("60 in train/, 10 (.png: read as they are) in test/ (.jpg), trained"), said
    # packed on macOS: a ._<name> beside each image (its metadata, under the image's own extension),
    # a .DS_Store and a folder: none is an image, in the counts as in the scripts (images.listable)
    for image in [*(data / "train").iterdir(), *(data / "test").iterdir()]:
        (image.parent / f"._{image.name}").write_bytes(b"\0\5\26\7 metadata")
    for folder in ("train", "test"):
        (data / folder / ".DS_Store").write_bytes(b"\0")
        (data / folder / "thumbs.jpg").mkdir()
    said = new(tmp_path, "mac", "--task", "image", "--gpu", "t4", "--data", str(data))
    assert said["images"].startswith("60 in train/, 10 (.png: read as they are) in test/ (.jpg), trained"), said
    # a few training images of another type among the .jpg files: train.py reads them all (images.
    # other_extension); the count was of the .jpg files alone ("55 in train/")
    for jpg in [p for p in sorted((data / "train").glob("*.jpg")) if p.is_file()][-5:]:
        jpg.rename(jpg.with_suffix(".png"))
    said = new(tmp_path, "mixed", "--task", "image", "--gpu", "t4", "--data", str(data))
    assert said["images"].startswith("60 (5 .png: read as they are) in train/, 10 (.png: read as they are) in"), said


def test_a_binary_sample_of_0s_says_how_to_hand_in_the_probability(tmp_path):
    """Histopathologic Cancer Detection: train_labels `id,label` (0/1), the sample `id,label` of 0s,
    scored by AUC. The 0s cannot say probability or label: the summary names --metric auc, and
    `kagtpl new --submission positive` renders it as train.py's default (the answers keep it), as
    `--metric auc` does with the metric too (it was dropped: copier asked no image project's metric)."""
    data = demo.write_digits(tmp_path / "digits", n_train=60, n_test=10)
    rows = (data / "labels.csv").read_text().splitlines()[1:]
    high = ("five", "six", "seven", "eight", "nine")
    labels = [f"{i},{int(breed in high)}" for i, breed in (r.split(",") for r in rows)]
    (data / "labels.csv").write_text("\n".join(["id,label", *labels]) + "\n")
    ids = [r.split(",")[0] for r in (data / "sample_submission.csv").read_text().splitlines()[1:]]
    (data / "sample_submission.csv").write_text("\n".join(["id,label", *(f"{i},0" for i in ids)]) + "\n")
    said = new(tmp_path, "cancer", "--task", "image", "--gpu", "t4", "--data", str(data))
    assert said["submission"].startswith("auto: the sample's 'label' holds a label, or the second class's"), said
    auto = "metric auto (log loss on probabilities, accuracy on labels, RMSE on a score)  [--submission --metric]"
    assert said["submission"].endswith(f"(0/1 labels scored by AUC: --metric auc); {auto}"), said
    flags = ["--task", "image", "--gpu", "t4", "--data", str(data)]
    said = new(tmp_path, "cancer-auc", *flags, "--submission", "positive")
    assert said["submission"] == f"positive: one column of the second class's probability; {auto}", said
    project = tmp_path / "cancer-auc"
    assert "submission: positive\n" in (project / ".copier-answers.yml").read_text()
    assert '    "submission": "positive",  # auto:' in (project / "train.py").read_text()
    said = new(tmp_path, "cancer-metric", *flags, "--metric", "auc")
    auc = "metric auc (each class's ROC AUC, averaged; two classes: the positive's)  [--submission --metric]"
    assert said["submission"] == f"positive: one column of the second class's probability; {auc}", said
    answers = (tmp_path / "cancer-metric" / ".copier-answers.yml").read_text()
    assert "submission: positive\n" in answers and "metric: auc\n" in answers, answers
    assert 'METRIC = "auc"  # auto:' in (tmp_path / "cancer-metric" / "train.py").read_text()


def test_one_hot_labels_are_read_as_the_samples_classes(tmp_path):
    """Plant Pathology's layout: train.csv holds a 0/1 column per class of the sample, not one label
    column: `cannot tell the label column among [...]; pass --label-col`, where any one column
    named would have trained a wrong task. Now label_col '' (one-hot), said in the summary."""
    data = demo.write_digits(tmp_path / "digits", n_train=60, n_test=10)
    labels = (data / "labels.csv").read_text().splitlines()
    classes = (data / "sample_submission.csv").read_text().splitlines()[0].split(",")[1:]
    rows = [
        ",".join([i, *("1" if c == label else "0" for c in classes)]) for i, label in (r.split(",") for r in labels[1:])
    ]
    (data / "labels.csv").write_text("\n".join([",".join(["id", *classes]), *rows]) + "\n")
    said = new(tmp_path, "plants", "--task", "image", "--gpu", "t4", "--data", str(data))
    assert said["labels"].startswith("labels.csv, id column 'id', one-hot (a 0/1 column per class), 60 rows"), said
    assert said["classes"].startswith("10 (eight, five, four, nine, one, ...)  [the sample's columns]"), said
    assert "label_col: ''\n" in (tmp_path / "plants" / ".copier-answers.yml").read_text()


def class_folders(digits: Path) -> Path:
    """The digits as Plant Seedlings ships its images: train/<class>/<image>, no labels CSV."""
    for line in (digits / "labels.csv").read_text().splitlines()[1:]:
        image_id, label = line.split(",")
        (digits / "train" / label).mkdir(exist_ok=True)
        (digits / "train" / f"{image_id}.jpg").rename(digits / "train" / label / f"{image_id}.jpg")
    (digits / "labels.csv").unlink()
    return digits


def test_class_folders_are_the_labels_without_a_labels_csv(tmp_path):
    """Plant Seedlings: train/<class>/<image> and no labels CSV: `does not look like an image
    competition: no labels CSV`. Now labels_csv '' (each folder's name is its images' label)."""
    data = class_folders(demo.write_digits(tmp_path / "digits", n_train=60, n_test=10))
    said = new(tmp_path, "seedlings", "--task", "image", "--gpu", "t4", "--data", str(data))
    assert said["images"].startswith("60 in train/, 10 in test/ (.jpg), trained at 32 px"), said
    assert said["labels"].startswith("class folders of train/ (<class>/<image>), id column 'id'"), said
    assert said["classes"].startswith("10 (eight, five, four, nine, one, ...)  [the folders' names]"), said
    assert "labels_csv: ''\n" in (tmp_path / "seedlings" / ".copier-answers.yml").read_text()
    # Dogs vs. Cats Redux: train/cat.0.jpg, train/dog.0.jpg, no labels CSV and no class folder
    for folder in sorted(p for p in (data / "train").iterdir() if p.is_dir()):
        for k, image in enumerate(sorted(folder.iterdir())):
            image.rename(data / "train" / f"{folder.name}.{k}.jpg")
        folder.rmdir()
    said = new(tmp_path, "redux", "--task", "image", "--gpu", "t4", "--data", str(data))
    assert said["labels"].startswith("the start of each file's name in train/ (<class>.<n>), id column 'id'"), said
    assert said["classes"].startswith("10 (eight, five, four, nine, one, ...)  [the names]"), said


def test_a_table_names_its_problem_metric_and_rows(tmp_path):
    data = table.write_table(tmp_path / "table", "multiclass")
    said = new(tmp_path, "tab", "--task", "tabular", "--gpu", "cpu", "--data", str(data), "--competition", "my-comp")
    train_rows = sum(1 for _ in open(data / "train.csv")) - 1
    assert said["table"].startswith(f"train.csv {train_rows} rows x ")
    assert said["columns"] == "id 'row_id', target 'label'  [--id-col --target]"
    assert said["problem"].startswith("multiclass, classes 3 (cultivar_0, cultivar_1, cultivar_2); metric logloss")
    assert said["models"].startswith("LightGBM, XGBoost and CatBoost")
    assert said["competition"] == "my-comp  [--competition]"


def test_a_text_competition_names_its_text_columns_lengths_and_model_folder(tmp_path):
    data = textdata.write_authors(tmp_path / "authors")
    said = new(tmp_path, "tx", "--task", "text", "--gpu", "cpu", "--data", str(data), "--model-dir", str(tmp_path))
    assert said["problem"] == "multiclass, classes 3 (EAP, HPL, MWS); metric logloss  [--problem --metric]"
    texts = r"columns text; median \d+ words, longest \d+ \(first 2000 rows\)  \[--text-cols]"
    assert re.fullmatch(texts, said["texts"])
    assert said["model"] == f"the Hugging Face folder {tmp_path}, read offline  [--model-dir]"


def test_one_hot_text_targets_are_named_as_classes_and_several_scores_as_numbers(tmp_path):
    """LLM Classification Finetuning's winner columns (one-hot) are classes scored by log loss
    (they were "regression, a number; metric rmse"); Feedback's score columns are numbers."""
    winners = textdata.write_winners(tmp_path / "winners")
    said = new(tmp_path, "w", "--task", "text", "--gpu", "cpu", "--data", str(winners), "--model-dir", str(tmp_path))
    assert said["problem"] == "multiclass, classes 3 (EAP, HPL, MWS), one-hot; metric logloss  [--problem --metric]"
    essays = textdata.write_essays(tmp_path / "essays")
    said = new(tmp_path, "e", "--task", "text", "--gpu", "cpu", "--data", str(essays), "--model-dir", str(tmp_path))
    assert said["problem"] == "regression, 2 numbers a row; metric rmse  [--problem --metric]"


def test_test_images_of_another_type_are_counted_where_the_layout_reads_them(tmp_path):
    """Detection: test images named by the sample's ids are read under another image type too
    (images.other_extension), so they count; the row-per-box layout takes its test ids from
    test/'s --image-ext files alone, so a .jpg there is not one of them."""
    from kagtpl import shapes

    for layout, said in (("wheat", "30 (2 .jpg: read as they are) in test/"), ("rows", "28 in test/")):
        data = shapes.write_boxes(tmp_path / layout, layout, n_train=20, n_test=30)
        for png in sorted((data / "test").glob("*.png"))[-2:]:
            png.rename(png.with_suffix(".jpg"))
        images = new(tmp_path / f"p_{layout}", "p", "--task", "detection", "--gpu", "cpu", "--data", str(data))[
            "images"
        ]
        assert f"20 in train/, {said} (.png)" in images, (layout, images)


def test_images_named_by_their_id_alone_are_each_counted_once(tmp_path):
    """--image-ext '' (detection's images named by their id alone): every file is one, read as it
    is named; an image type among them is not counted a second time as another type."""
    from kagtpl import summary

    for name in ("a", "b", "c.png"):
        (tmp_path / name).write_bytes(b"\0")
    assert summary.count_images(tmp_path, ext="") == "3"
    assert summary.count_images(tmp_path, ext=".png") == "1"
