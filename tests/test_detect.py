"""Data detection at generation time (kagtpl/detect.py), on small folders written here: no
rendering, no training. Each layout Kaggle uses, and each way detection must refuse to guess."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kagtpl import detect
from kagtpl.errors import KagtplError


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def images(folder: Path, names) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"\xff\xd8 not decoded at generation time")


def test_dog_breed_layout(tmp_path):
    data = write(
        tmp_path,
        {"labels.csv": "id,breed\na1,beagle\nb2,pug\n", "sample_submission.csv": "id,beagle,pug\nt1,0.5,0.5\n"},
    )
    images(data, ["train/a1.jpg", "train/b2.jpg", "test/t1.jpg"])
    assert detect.detect_image(data, {}) == {
        "labels_csv": "labels.csv",
        "id_col": "id",
        "label_col": "breed",
        "train_dir": "train",
        "test_dir": "test",
        "image_ext": ".jpg",
        "sample_submission": "sample_submission.csv",
        "submission": "auto",  # train.py reads the sample (kagtpl new --submission names it)
    }


@pytest.mark.parametrize(
    ("values", "submission", "warned"),
    [(range(1, 101, 2), "auto", True), ([0.5, 1.5, 2.0], "number", False), (range(5), "auto", False)],
)
def test_image_labels_that_are_a_score_train_a_regression_or_say_how(tmp_path, capsys, values, submission, warned):
    """PetFinder's Pawpularity (1-100) rendered 50 classes with no word about it: whole numbers may
    be a score or class ids, so a WARNING names --submission number; a fraction is a score (number);
    five grades (APTOS's diagnosis 0-4) are classes and say nothing."""
    rows = [f"i{k},{v}" for k, v in enumerate(values)]
    data = write(tmp_path, {"train.csv": "\n".join(["Id,Pawpularity", *rows]) + "\n",
                            "sample_submission.csv": "Id,Pawpularity\nt1,0\n"})  # fmt: skip
    images(data, [f"train/i{k}.jpg" for k in range(len(rows))] + ["test/t1.jpg"])
    found = detect.detect_image(data, {})
    assert (found["label_col"], found["submission"]) == ("Pawpularity", submission)
    said = capsys.readouterr().out
    assert ("WARNING: train.csv's 'Pawpularity' holds 50 whole numbers" in said) == warned, said
    assert ("learned as one with --submission number" in said) == warned, said
    with pytest.raises(KagtplError, match=r"--submission number writes one score column after the id; .* has 2"):
        detect.detect_image(write(tmp_path, {"sample_submission.csv": "Id,a,b\nt1,0,0\n"}), {"submission": "number"})


def test_generic_layout_png_ids_with_extension_and_overrides(tmp_path):
    data = write(
        tmp_path,
        {"train.csv": "image,label\nx.png,cat\n", "sample_submission.csv": "image,label\ny.png,cat\n"},
    )
    images(data, ["train_images/x.png", "test_images/y.png"])
    found = detect.detect_image(data, {})
    assert (found["labels_csv"], found["id_col"], found["label_col"]) == ("train.csv", "image", "label")
    assert (found["train_dir"], found["test_dir"], found["image_ext"]) == ("train_images", "test_images", ".png")
    assert detect.detect_image(data, {"label_col": "label", "image_ext": ".png"})["image_ext"] == ".png"


@pytest.mark.parametrize(
    "files,images_,message",
    [
        ({"labels.csv": "id,breed\na,b\n"}, ["train/a.jpg"], "no sample submission CSV"),
        (
            {"labels.csv": "id,breed,colour\na,b,c\n", "sample_submission.csv": "id,x,y\nt,0.5,0.5\n"},
            ["train/a.jpg", "test/t.jpg"],
            "cannot tell the label column among ['breed', 'colour']; pass --label-col",
        ),
        (
            {"labels.csv": "id,breed\na,b\n", "sample_submission.csv": "id,b\nt,1\n"},
            ["test/t.jpg"],
            "no training image folder",
        ),
        (
            {"labels.csv": "id,breed\na,b\n", "sample_submission.csv": "id,b\nt,1\n"},
            ["train/other.jpg", "test/t.jpg"],
            "no image named after the first id 'a'; pass --image-ext",
        ),
    ],
)
def test_image_detection_refuses_to_guess(tmp_path, files, images_, message):
    data = write(tmp_path, files)
    images(data, images_)
    with pytest.raises(KagtplError, match=re.escape(message)):
        detect.detect_image(data, {})


def table(tmp_path, train: str, test: str, sample: str, sample_name="sample_submission.csv") -> Path:
    return write(tmp_path, {"train.csv": train, "test.csv": test, sample_name: sample})


@pytest.mark.parametrize(
    "train,test,sample,sample_name,expected",
    [
        # a probability of the positive class: AUC
        ("id,x,target\n1,0.5,0\n2,0.1,1\n", "id,x\n3,0.2\n", "id,target\n3,0.5\n", "sample_submission.csv",
         ("target", "binary", "probs", "auc")),
        # titanic: 0/1 labels in gender_submission.csv: accuracy
        ("PassengerId,Sex,Survived\n1,m,0\n2,f,1\n", "PassengerId,Sex\n3,f\n", "PassengerId,Survived\n3,0\n",
         "gender_submission.csv", ("Survived", "binary", "label", "accuracy")),
        # a probability column per class: multiclass, log loss (Otto's sampleSubmission.csv: was "no submission CSV")
        ("id,x,species\n1,0.1,a\n2,0.2,b\n3,0.3,c\n", "id,x\n4,0.1\n", "id,a,b,c\n4,0.3,0.3,0.4\n",
         "sampleSubmission.csv", ("species", "multiclass", "probs", "logloss")),
        # string labels, one label column: multiclass accuracy
        ("id,x,y\n1,1,cat\n2,2,dog\n3,3,cow\n", "id,x\n4,1\n", "id,y\n4,cat\n", "sample_submission.csv",
         ("y", "multiclass", "label", "accuracy")),
        # one value column under another name (Contradictory, My Dear Watson's prediction): the target's labels
        ("id,x,label\n1,1,0\n2,2,1\n3,3,2\n", "id,x\n4,1\n", "id,prediction\n4,0\n", "sample_submission.csv",
         ("label", "multiclass", "label", "accuracy")),
        # ...or its probability (a fraction there): binary, AUC; both were one class's probability column
        ("id,x,is_fraud\n1,1,0\n2,2,1\n", "id,x\n3,1\n", "id,probability\n3,0.5\n", "sample_submission.csv",
         ("is_fraud", "binary", "probs", "auc")),
        # many distinct numbers: regression, RMSE
        ("id,x,SalePrice\n1,1,100.5\n2,2,230.25\n3,3,170.0\n", "id,x\n4,1\n", "id,SalePrice\n4,150\n",
         "sample_submission.csv", ("SalePrice", "regression", "label", "rmse")),
        # three training labels a row, space-separated (Playground S5E6's fertilizers): MAP@3, not one label
        ("id,x,Fertilizer Name\n1,1,DAP\n2,2,Urea\n3,3,28-28\n4,4,DAP\n", "id,x\n5,1\n",
         "id,Fertilizer Name\n5,DAP Urea 28-28\n", "sample_submission.csv",
         ("Fertilizer Name", "multiclass", "label", "map3")),
        # two words a row that are no two labels (a class named with a space): one label
        ("id,x,kind\n1,1,red wine\n2,2,white wine\n3,3,rose\n", "id,x\n4,1\n", "id,kind\n4,red wine\n",
         "sample_submission.csv", ("kind", "multiclass", "label", "accuracy")),
    ],
)  # fmt: skip
def test_table_layouts(tmp_path, train, test, sample, sample_name, expected):
    found = detect.detect_tabular(table(tmp_path, train, test, sample, sample_name), {})
    assert (found["target"], found["problem"], found["submission"], found["metric"]) == expected
    assert found["sample_submission"] == sample_name and found["train_csv"] == "train.csv"


def test_table_overrides_and_refusals(tmp_path):
    data = table(tmp_path, "id,a,b,c\n1,1,2,3\n", "id,a\n2,1\n", "id,p,q\n2,0.5,0.5\n")
    with pytest.raises(KagtplError, match=r"cannot tell the target among \['b', 'c'\]; pass --target"):
        detect.detect_tabular(data, {})
    assert detect.detect_tabular(data, {"target": "b", "problem": "multiclass"})["target"] == "b"
    with pytest.raises(KagtplError, match="metric 'auc' does not fit a regression problem"):
        detect.detect_tabular(data, {"target": "b", "problem": "regression", "metric": "auc"})
    with pytest.raises(KagtplError, match="no such folder"):
        detect.detect_tabular(tmp_path / "nope", {})
    # MAP@3 hands in three labels a row: not a probability per class, nor a binary or regression target
    with pytest.raises(KagtplError, match=r"--metric map3 hands in three labels a row, but .*holds a probability"):
        detect.detect_tabular(data, {"target": "b", "problem": "multiclass", "metric": "map3"})
    with pytest.raises(KagtplError, match="metric 'map3' does not fit a binary problem"):
        detect.detect_tabular(data, {"target": "b", "problem": "binary", "metric": "map3"})


@pytest.mark.parametrize(("positives", "sample_value", "warned"), [(2, "0", True), (12, "0", False), (2, "0.5", False)])
def test_a_rare_class_handed_in_as_labels_is_said_with_the_flag_for_probabilities(
    tmp_path, capsys, positives, sample_value, warned
):
    """SIIM-ISIC's melanoma (1.8% of images) and Santander's transactions (10%) ship a sample of 0s,
    and score AUC: kagtpl read labels (accuracy), and labels say the common class nearly everywhere,
    AUC near 0.5, without a word. Now a rare class (under 10% of rows) handed in as labels is one
    WARNING naming the flag for probabilities, --metric auc (an image's and a table's alike). A 30%
    class, or a sample of probabilities, says nothing."""
    rows = [f"i{k},{int(k < positives)}" for k in range(40)]
    data = write(tmp_path / "img", {"train.csv": "\n".join(["image_name,target", *rows]) + "\n",
                                    "sample_submission.csv": f"image_name,target\nt1,{sample_value}\n"})  # fmt: skip
    images(data, [f"train/i{k}.jpg" for k in range(40)] + ["test/t1.jpg"])
    detect.detect_image(data, {})
    said = capsys.readouterr().out
    flag = "pass --metric auc"
    assert (f"WARNING: train.csv's 'target' is '1' in {positives / 40:.1%} of rows" in said and flag in said) == warned
    rows = [f"{k},{k % 7},{int(k < positives)}" for k in range(40)]
    data = table(
        tmp_path / "tab", "\n".join(["id,x,target", *rows]) + "\n", "id,x\n99,1\n", f"id,target\n99,{sample_value}\n"
    )
    detect.detect_tabular(data, {})
    assert (
        "labels would say '0' nearly everywhere" in (said := capsys.readouterr().out) and "--metric auc" in said
    ) == warned
    detect.detect_tabular(data, {"metric": "accuracy"})  # the metric named: nothing to say
    assert "labels would say" not in capsys.readouterr().out


def test_an_image_metric_is_checked_against_what_the_submission_holds(tmp_path, capsys):
    """--metric on an image project (it was dropped without a word: copier asked no image the
    question). auc or logloss on a sample of 0s with two classes (Histopathologic, SIIM-ISIC) hands
    in the second class's probability (--submission positive); a metric that does not score what
    the submission holds, or a probability in one column for five classes, is one error."""
    rows = [f"i{k},{int(k < 3)}" for k in range(40)]
    data = write(tmp_path / "two", {"train_labels.csv": "\n".join(["id,label", *rows]) + "\n",
                                    "sample_submission.csv": "id,label\nt1,0\n"})  # fmt: skip
    images(data, [f"train/i{k}.jpg" for k in range(40)] + ["test/t1.jpg"])
    for metric in ("auc", "logloss"):
        found = detect.detect_image(data, {"metric": metric})
        assert (found["submission"], found["metric"]) == ("positive", metric)
    assert "labels would say" not in capsys.readouterr().out  # the metric named: nothing to warn of
    assert detect.detect_image(data, {"metric": "accuracy"})["submission"] == "auto"
    unfit = (("positive", "accuracy", "positive"), ("label", "auc", "label"), ("auto", "rmse", "label"))
    for given, metric, kind in unfit:
        with pytest.raises(KagtplError, match=rf"--metric {metric} does not score a {kind} submission"):
            detect.detect_image(data, {"metric": metric, "submission": None if given == "auto" else given})
    rows = [f"i{k},{k % 5}" for k in range(40)]
    (data / "train_labels.csv").write_text("\n".join(["id,label", *rows]) + "\n")
    five = r"--metric auc scores probabilities, but .*two classes \(train_labels.csv has 5\)"
    with pytest.raises(KagtplError, match=five):
        detect.detect_image(data, {"metric": "auc"})
    # QWK (APTOS): whole grades, learned as a score; words are no grades
    assert (detect.detect_image(data, {"metric": "qwk"})["submission"], "qwk") == ("number", "qwk")
    (data / "train_labels.csv").write_text("\n".join(["id,label", *(f"i{k},{'ab'[k % 2]}" for k in range(40))]) + "\n")
    with pytest.raises(KagtplError, match=r"--metric qwk scores ordered grades .*'label' holds a, b"):
        detect.detect_image(data, {"metric": "qwk"})
    probs = write(tmp_path / "probs", {"train_labels.csv": "id,label\ni0,a\ni1,b\ni2,c\n",
                                       "sample_submission.csv": "id,a,b,c\nt1,0.3,0.3,0.4\n"})  # fmt: skip
    images(probs, ["train/i0.jpg", "train/i1.jpg", "train/i2.jpg", "test/t1.jpg"])
    assert detect.detect_image(probs, {"metric": "auc"}) == {**detect.detect_image(probs, {}), "metric": "auc"}
    with pytest.raises(KagtplError, match=r"--metric accuracy does not score a probs submission .*logloss or auc"):
        detect.detect_image(probs, {"metric": "accuracy"})


def test_f1_and_mcc_score_binary_labels(tmp_path, capsys):
    """Disaster Tweets (F1) and Playground S4E8's mushrooms (MCC) score the labels handed in: --metric
    f1 or mcc hands in labels (a sample of probabilities is said, as for accuracy), and fits binary
    problems only. Neither was a metric kagtpl knew: "metric 'f1' does not fit a binary problem"."""
    labels = table(tmp_path / "l", "id,x,target\n1,1,0\n2,2,1\n", "id,x\n3,1\n", "id,target\n3,0\n")
    for metric in ("f1", "mcc"):
        found = detect.detect_tabular(labels, {"metric": metric})
        assert (found["problem"], found["submission"], found["metric"]) == ("binary", "label", metric)
    assert capsys.readouterr().out == ""
    probs = table(tmp_path / "p", "id,x,target\n1,1,0\n2,2,1\n", "id,x\n3,1\n", "id,target\n3,0.5\n")
    assert detect.detect_tabular(probs, {"metric": "f1"})["submission"] == "label"
    assert (
        "WARNING: --metric f1 scores labels, but sample_submission.csv's 'target' holds numbers"
        in capsys.readouterr().out
    )
    three = table(tmp_path / "m", "id,x,y\n1,1,a\n2,2,b\n3,3,c\n", "id,x\n4,1\n", "id,y\n4,a\n")
    with pytest.raises(KagtplError, match="metric 'f1' does not fit a multiclass problem"):
        detect.detect_tabular(three, {"metric": "f1"})


def test_digit_recognizers_row_number_ids_and_label_column(tmp_path):
    """Digit Recognizer: the sample's ImageId (1, 2, ...) is a column of neither table, and its
    Label is train.csv's label. It was "train.csv: no id column 'ImageId'": now the ids are the
    rows' numbers from 1 and the labels fill the sample's Label; ids that are not the test's row
    numbers, and a text project, still get that error."""
    train = "label,pixel0,pixel1\n3,0,255\n7,12,0\n1,1,250\n"
    data = table(tmp_path / "digits", train, "pixel0,pixel1\n0,200\n9,3\n", "ImageId,Label\n1,0\n2,0\n")
    found = detect.detect_tabular(data, {})
    assert (found["id_col"], found["row_ids"], found["target"]) == ("ImageId", "1", "label")
    assert (found["problem"], found["submission"], found["metric"]) == ("multiclass", "label", "accuracy")
    (data / "sample_submission.csv").write_text("ImageId,Label\n1,0\n3,0\n")  # not 1, 2: not row numbers
    with pytest.raises(KagtplError, match=r"train.csv: no id column 'ImageId'"):
        detect.detect_tabular(data, {})
    texts = table(tmp_path / "texts", "t,label\nsome words here and there,1\nother words again here,0\n",
                  "t\nmore words in a row\n", "Id,label\n1,0\n")  # fmt: skip
    with pytest.raises(KagtplError, match=r"train.csv: no id column 'Id'"):
        detect.detect_text(texts, {})
    assert "row_ids" not in detect.detect_tabular(table(tmp_path / "ids", "id,x,y\n1,2,3\n", "id,x\n2,1\n",
                                                         "id,y\n2,0\n"), {})  # fmt: skip


def test_home_credits_application_tables_are_found_and_a_missing_one_names_its_flag(tmp_path):
    """Home Credit ships application_train.csv and application_test.csv beside bureau.csv and
    the rest: the one *train*.csv and *test*.csv are the tables (it was "no train.csv"); with none,
    the error names --train-csv."""
    data = write(tmp_path / "hc", {
        "application_train.csv": "SK_ID_CURR,TARGET,AMT\n1,0,5.0\n2,1,7.5\n", "bureau.csv": "SK_ID_CURR,X\n1,2\n",
        "application_test.csv": "SK_ID_CURR,AMT\n3,1.0\n", "sample_submission.csv": "SK_ID_CURR,TARGET\n3,0.5\n",
    })  # fmt: skip
    found = detect.detect_tabular(data, {})
    assert (found["train_csv"], found["test_csv"], found["target"]) == (
        "application_train.csv",
        "application_test.csv",
        "TARGET",
    )
    (data / "sample_submission.csv").unlink()
    with pytest.raises(
        KagtplError, match=r"no submission CSV \(looked for sample_submission.csv\); name yours with --sample"
    ):
        detect.detect_tabular(data, {})
    (data / "sample_submission.csv").write_text("SK_ID_CURR,TARGET\n3,0.5\n")
    (data / "application_train.csv").unlink()
    with pytest.raises(KagtplError, match=r"no train.csv \(looked for train.csv\); name yours with --train-csv$"):
        detect.detect_tabular(data, {})


def test_a_downloaded_zip_not_yet_unzipped_is_named(tmp_path):
    """`kaggle competitions download -c titanic` leaves titanic.zip: the error said only "no
    submission CSV"; it names the zip and asks to unzip it, or the folder it was unzipped into."""
    (tmp_path / "titanic.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    for task in (detect.detect_tabular, detect.detect_image):
        with pytest.raises(KagtplError, match=r"holds titanic.zip: unzip it there first"):
            task(tmp_path, {})
    # unzipped into a folder of its own: that folder named (a project's output/submission.csv is not one)
    write(tmp_path / "output", {"submission.csv": "id,y\n1,0\n"})
    with pytest.raises(KagtplError, match="no submission CSV .*titanic.zip"):
        detect.detect_tabular(tmp_path, {})
    write(tmp_path / "titanic", {"gender_submission.csv": "PassengerId,Survived\n892,0\n"})
    with pytest.raises(
        KagtplError, match=rf"holds no submission CSV; titanic/ holds gender_submission.csv: --data {tmp_path}/titanic$"
    ):
        detect.detect_tabular(tmp_path, {})


def test_a_table_given_to_the_image_task_names_the_task_flag(tmp_path):
    """kagtpl new's task is image unless --task names another: a table's folder said "cannot tell the
    label column among [...]; pass --label-col", a flag that could never make it an image project."""
    data = table(tmp_path, "id,x,y\n1,1,a\n2,2,b\n", "id,x\n3,1\n", "id,y\n3,a\n")
    with pytest.raises(
        KagtplError, match=r"no training image folder .*; train.csv and test.csv: a table or text\? --task"
    ):
        detect.detect_image(data, {})


def test_tables_named_in_capitals_are_found(tmp_path):
    """Train.csv, Test.csv and SampleSubmission.csv (some competitions capitalise them): the
    detection read train*.csv and test*.csv in lower case only, and said "no train.csv"."""
    data = table(tmp_path, "id,x,y\n1,1,a\n2,2,b\n", "id,x\n3,1\n", "id,y\n3,a\n", "SampleSubmission.csv")
    for name in ("train", "test"):
        (data / f"{name}.csv").rename(data / f"{name.title()}.csv")
    found = detect.detect_tabular(data, {})
    assert (found["train_csv"], found["test_csv"], found["sample_submission"]) == (
        "Train.csv",
        "Test.csv",
        "SampleSubmission.csv",
    )


def test_image_size_from_the_images_median_side(tmp_path):
    """The profile's size is the ceiling; smaller images pull it down to their median side,
    rounded up to a multiple of 32. Real image files, sizes read from their headers."""
    from PIL import Image

    from kagtpl.template import hardware

    for i, (w, h) in enumerate([(28, 28), (30, 26), (500, 375), (28, 28), (29, 31)]):
        Image.new("RGB", (w, h)).save(tmp_path / f"{i}.png")
    side = detect.median_side(tmp_path, ".png")
    assert side == 28.5  # widths and heights together: 26 28 28 28 28 | 29 30 31 375 500
    hw = hardware()
    assert hw.image_size_for(hw.PROFILES["a10"], side)[0] == 32
    assert hw.image_size_for(hw.PROFILES["cpu"], 100)[0] == 128  # 100 -> 128, the CPU ceiling
    assert hw.image_size_for(hw.PROFILES["a10"], 600)[0] == 224  # large photos: the profile's size
    assert hw.image_size_for(hw.PROFILES["a10"], 161)[0] == 192
    assert hw.image_size_for(hw.PROFILES["t4"], None) == (224, "the t4 profile's default")
    assert detect.median_side(tmp_path, ".jpg") is None  # no such images


def test_class_folders_are_measured_from_every_class_in_turn(tmp_path):
    """train/<class>/<image> (Plant Seedlings): the median side is taken over every class's images,
    in turn up to the limit, where the first class's images stood for all."""
    from PIL import Image

    for k, (name, side) in enumerate([("alpha", 40), ("beta", 200), ("gamma", 200)]):
        (tmp_path / name).mkdir()
        for i in range(4 + k):
            Image.new("RGB", (side, side)).save(tmp_path / name / f"{i}.png")
    (tmp_path / "beta" / "._0.png").write_bytes(b"\0" * 8)  # macOS's metadata: no image, not measured
    assert detect.median_side(tmp_path, ".png") == 200  # 4 images of 40, 11 of 200
    assert detect.median_side(tmp_path, ".png", limit=3) == 200  # one of each class: 40, 200, 200
    assert [p.parent.name for p in detect.sampled(tmp_path, ".png", 4)] == ["alpha", "beta", "gamma", "alpha"]
