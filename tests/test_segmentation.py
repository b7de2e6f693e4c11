"""--task segmentation: the layouts kagtpl new detects, RLE both ways, tiles, the threshold and
minimum area chosen on OOF, preflight, and render-and-run of each layout on generated shapes data
(real smp, timm and albumentations on CPU)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from conftest import (
    GROW_ENV,
    JUDGED_ENV,
    assert_plan_cut_to_budget,
    dry_run_into_output,
    import_project,
    predict_streamed,
    run_script,
    seed_budget,
    seeds_judged,
    start_until,
)
from kagtpl import detect, new, shapes
from kagtpl.cli import app
from kagtpl.errors import KagtplError
from kagtpl.template import hardware

SIZE, TRAIN, TEST = 96, 24, 6
FAST = ["--device", "cpu", "--workers", "0"]


@pytest.fixture(scope="module")
def shapes_data(tmp_path_factory) -> dict:
    """Every layout of the generated shapes competition: {layout: data folder}."""
    root = tmp_path_factory.mktemp("shapes")
    return {layout: shapes.write_shapes(root / layout, layout, TRAIN, TEST, SIZE) for layout in shapes.LAYOUTS}


def make_project(tmp_path, data, name: str = "seg", **flags):
    # timm's test_resnet as the U-Net's encoder: 2.3M parameters in all, against resnet18's 14.3M
    plan = {"folds": 2, "epochs": 1, "model": "test_resnet", **flags}
    return new.new_project(new.NewAnswers(name=name, task="segmentation", gpu="cpu", data=data, dest=tmp_path, **plan))


@pytest.fixture(scope="module")
def png_project(tmp_path_factory, shapes_data):
    """A binary PNG-mask project that trains on 64 px tiles of its 96 px images."""
    return make_project(tmp_path_factory.mktemp("png"), shapes_data["png"], image_size=64)


@pytest.fixture(scope="module")
def m(png_project):
    return import_project(png_project, ("train", "masks", "errors"))


# ----------------------------------------------------------------------------- kagtpl new detects the layout


def test_kagtpl_new_detects_each_layout(shapes_data):
    found = {layout: detect.detect_segmentation(shapes_data[layout], {}) for layout in shapes.LAYOUTS}
    assert found["png"]["mask_dir"] == "train_masks" and found["png"]["mask_values"] == "255"
    assert found["classes"]["mask_values"] == "1,2"  # class indices, read from the mask files
    assert found["rle"]["mask_dir"] == "" and found["rle"]["train_csv"] == "train.csv"
    assert found["rle"]["class_col"] == "" and found["rle-classes"]["class_col"] == "class"
    assert found["rle"]["rle_start"] == 1 and found["png"]["image_ext"] == ".png"


def test_a_zero_indexed_rle_is_detected_and_a_bad_sample_is_one_line(tmp_path, shapes_data):
    data = tmp_path / "zero"
    data.mkdir()
    for name in ("train", "test", "sample_submission.csv"):
        (data / name).symlink_to(shapes_data["rle"] / name)
    (data / "train.csv").write_text("id,rle\nimg0000,0 5\n")
    assert detect.detect_segmentation(data, {})["rle_start"] == 0
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sample_submission.csv").write_text("id,a,b,rle\nx,1,2,\n")
    with pytest.raises(KagtplError, match="id, rle or id, class, rle"):
        detect.detect_segmentation(tmp_path / "bad", {})
    with pytest.raises(KagtplError, match="multiple of 32"):
        make_project(tmp_path, shapes_data["png"], name="odd", image_size=100)
    assert not (tmp_path / "odd").exists()


# ----------------------------------------------------------------------------- RLE, tiles, the OOF choice


@pytest.mark.parametrize(("order", "start"), [("F", 1), ("C", 1), ("F", 0)])
def test_rle_round_trips_in_every_convention(m, order, start):
    rng = np.random.default_rng(0)
    last = np.zeros((7, 5), np.uint8)
    last[-1, -1] = 1  # touches the last pixel
    for mask in (rng.random((7, 5)) > 0.5, np.zeros((7, 5)), np.ones((7, 5)), last):
        rle = m.masks.rle_encode(mask, order, start)
        assert np.array_equal(m.masks.rle_decode(rle, mask.shape, order, start), mask.astype(np.uint8))
    assert m.masks.rle_encode(np.zeros((7, 5)), order, start) == ""
    assert m.masks.rle_encode(last, order, start) == f"{35 - 1 + start} 1"


def test_rle_is_kaggles_column_major_convention_and_matches_an_independent_encoder(m):
    mask = np.zeros((3, 4), np.uint8)
    mask[0:2, 1] = 1  # pixels 4 and 5, counted down the columns from 1
    assert m.masks.rle_encode(mask) == "4 2" and m.masks.rle_encode(mask, "C") == "2 1 6 1"
    rng = np.random.default_rng(1)
    for _ in range(5):
        random = rng.random((13, 9)) > 0.6
        assert m.masks.rle_encode(random) == shapes.runs(random)


@pytest.mark.parametrize(
    ("rle", "why"),
    [("11 3", "past the image's last"), ("1 2 3", "pairs"), ("a b", "whole numbers"), ("0 2", "not a run")],
)
def test_a_bad_rle_is_a_data_error_naming_its_line(m, rle, why):
    with pytest.raises(m.errors.DataError, match=f"train.csv line 7.*{why}"):
        m.masks.rle_decode(rle, (3, 4), "F", 1, "train.csv line 7")


def test_tiles_cover_the_image_and_stitch_smoothly(m):
    assert m.masks.tile_starts(96, 64, 16) == [0, 32] and m.masks.tile_starts(64, 64, 16) == [0]
    assert m.masks.tile_starts(200, 64, 16)[-1] == 136  # the last tile ends on the edge
    x = torch.rand(2, 3, 96, 96)
    calls = []

    def probs(tile):
        calls.append(tile.shape)
        return tile[:, :1]

    stitched = m.masks.predict_tiled(probs, x, 64, 16)
    assert len(calls) == 4 and all(c[-2:] == (64, 64) for c in calls)
    torch.testing.assert_close(stitched, x[:, :1])  # a weighted mean of equal values is the value
    window = m.masks.gaussian_window(64, "cpu", None)
    assert window.max() == pytest.approx(1, abs=0.01) and 0.01 < window[0, 0] < 0.1 < window[0, 32] < window[32, 32]


def test_threshold_and_minimum_area_are_chosen_on_oof_statistics(m):
    """Images whose masks come out right above 0.7, plus empty images with a few stray pixels:
    the choice is 0.7 and a minimum area that empties the strays, and it scores above 0.5's."""
    truth = np.zeros((8, 1, 32, 32), bool)
    truth[:4, 0, 8:24, 8:24] = True
    probs = np.where(truth, 0.8, 0.6).astype(np.float32)  # 0.6 everywhere else: wrong below 0.6
    probs[4:, 0, :2, :2] = 0.95  # 4 stray pixels on each empty image
    stats = m.masks.image_stats(torch.from_numpy(probs), torch.from_numpy(truth), torch.zeros(8)).numpy()
    assert stats.shape == (8, len(m.masks.stat_columns(["mask"])))
    chosen = m.masks.choose_postprocess(truth.sum((1, 2, 3)), stats, ["mask"], 32 * 32, "dice")
    rule = chosen["classes"]["mask"]
    assert 0.6 <= rule["threshold"] < 0.8 and 4 < rule["min_area"] <= 256
    assert chosen["tuned"] == pytest.approx(1.0) and chosen["plain"] < 0.6
    empty = m.masks.apply_postprocess(probs[4, 0], rule, (64, 48))  # emptied, at the image's own size
    assert empty.shape == (64, 48) and not empty.any()
    assert int(m.masks.apply_postprocess(probs[0, 0], rule, (64, 64)).sum()) == pytest.approx(32 * 32, rel=0.2)


# ----------------------------------------------------------------------------- preflight


def spoil(tmp_path, source, name: str):
    """A copy of a data folder (images linked, tables and masks copied) to spoil."""
    dest = tmp_path / name
    dest.mkdir()
    for item in source.iterdir():
        if item.name == "train_masks":
            (dest / item.name).mkdir()
            for f in item.iterdir():
                (dest / item.name / f.name).write_bytes(f.read_bytes())
        elif item.is_dir():
            (dest / item.name).symlink_to(item)
        else:
            (dest / item.name).write_bytes(item.read_bytes())
    return dest


def preflight(m, data, *flags) -> None:
    m.train.main([*FAST, "--data-dir", str(data), "--out-dir", str(data.parent / "out"), *flags])


def test_a_timm_classification_checkpoint_loads_into_the_encoder_without_a_false_warning(tmp_path, m, capsys):
    """The encoder (timm features_only) has no classifier head nor efficientnet's last conv: their
    tensors in a classification checkpoint are expected, not 'weights of another model'. resnet34's
    weights for a resnet18 encoder (every tensor fits, half the file is left over) still warn."""
    import timm

    config = {"arch": "unet", "mask_dir": "train_masks", "mask_values": "255", "class_col": ""}
    for name, source, warns in (
        ("resnet18", "resnet18", False),
        ("efficientnet_b0", "efficientnet_b0", False),
        ("resnet18", "resnet34", True),
    ):
        path = tmp_path / f"{source}-for-{name}.pth"
        torch.save(timm.create_model(source, pretrained=False, num_classes=10).state_dict(), path)
        m.train.build_model({**config, "model": name, "weights": str(path)}, 1)
        out = capsys.readouterr().out
        assert ("WARNING: --weights" in out) == warns, (name, source, out)


def test_preflight_names_the_file_of_each_bad_mask(tmp_path, m, shapes_data):
    from PIL import Image

    data = spoil(tmp_path, shapes_data["png"], "png")
    mask = data / "train_masks" / "img0003.png"
    Image.fromarray(np.zeros((SIZE, SIZE + 4), np.uint8)).save(mask)
    with pytest.raises(m.errors.DataError, match=r"img0003.png: mask is 100x96, its image .* is 96x96"):
        preflight(m, data)
    mask.write_bytes(b"not a png")
    with pytest.raises(m.errors.DataError, match="img0003.png: mask of .* cannot be decoded"):
        preflight(m, data)
    Image.fromarray(np.full((SIZE, SIZE), 7, np.uint8)).save(mask)
    with pytest.raises(m.errors.DataError, match=r"img0003.png: value\(s\) \[7\] are not background"):
        preflight(m, data)
    mask.unlink()
    with pytest.raises(m.errors.DataError, match="img0003.png: mask of .* missing"):
        preflight(m, data)
    args = m.train.get_args(["--data-dir", str(data), "--missing-mask", "empty"])
    row = list(m.train.training_rows(data, args, ["rle"]).itertuples())[3]
    assert not m.train.training_mask(args, row, "binary").any()  # empty masks allowed: read as empty


def test_hidden_files_beside_the_images_are_not_training_images(tmp_path, m, shapes_data):
    """A data folder packed on macOS holds ._<name> beside each file (its metadata, under the
    file's own extension) and a .DS_Store: the preflight stopped on `train/._img0000.png: missing
    or cannot be decoded as an image`. Hidden files and folders are not images."""
    data = tmp_path / "data"
    shutil.copytree(shapes_data["png"], data)
    images = sorted(p.name for p in (data / "train").iterdir())
    for name in images:
        (data / "train" / f"._{name}").write_bytes(b"\0\5\26\7 metadata")
    (data / "train" / ".DS_Store").write_bytes(b"\0")
    (data / "train" / "sub.png").mkdir()
    args = m.train.get_args(["--data-dir", str(data)])
    rows = m.train.training_rows(data, args, ["rle"])
    assert list(rows["id"]) == [n.removesuffix(".png") for n in images], list(rows["id"])


def test_carvanas_masks_named_id_mask_gif_are_found_and_read(tmp_path, m, shapes_data):
    """Carvana's layout: train_masks/<id>_mask.gif. kagtpl new found no mask folder (GIF is not an
    image extension) and, given --mask-dir, took the first file's suffix, .gif: every mask was
    then "missing (--missing-mask empty reads it as empty)", advice that trains on empty masks.
    Now the folder is found, the suffix read against the image ids, and a suffix no mask has is
    one error naming the files there."""
    from PIL import Image

    data = tmp_path / "data"
    shutil.copytree(shapes_data["png"], data)
    for png in sorted((data / "train_masks").iterdir()):
        Image.open(png).save(png.with_name(f"{png.stem}_mask.gif"))
        png.unlink()
    found = detect.detect_segmentation(data, {})
    assert (found["mask_dir"], found["mask_ext"]) == ("train_masks", "_mask.gif"), found
    flags = ["--data-dir", str(data), "--mask-values", found["mask_values"]]  # GIF: palette indices
    args = m.train.get_args([*flags, "--mask-ext", found["mask_ext"]])
    rows = m.train.training_rows(data, args, ["rle"])
    assert len(rows) == TRAIN and all(Path(p).is_file() for p in rows["mask"])
    assert sum(m.train.training_mask(args, row, "binary").any() for row in rows.itertuples()) > TRAIN // 2
    args = m.train.get_args([*flags, "--mask-ext", ".gif"])
    with pytest.raises(m.errors.DataError, match=r"no training image has its mask <id>\.gif in train_masks/ "):
        m.train.training_rows(data, args, ["rle"])


def test_tgs_salts_train_images_and_train_masks_are_found_and_read(tmp_path, m, shapes_data):
    """TGS Salt Identification's layout: train/images/, train/masks/, test/images/. kagtpl new took
    train/ itself for the image folder (its images/ and masks/ folders counted as images named by
    id alone), then found no mask folder: now each is found and train.py reads every pair."""
    data = tmp_path / "tgs"
    for src, dest in (("train", "train/images"), ("train_masks", "train/masks"), ("test", "test/images")):
        shutil.copytree(shapes_data["png"] / src, data / dest)
    shutil.copy(shapes_data["png"] / "sample_submission.csv", data)
    found = detect.detect_segmentation(data, {})
    assert (found["train_dir"], found["test_dir"], found["mask_dir"]) == ("train/images", "test/images", "train/masks")
    flags = [f"--{k.replace('_', '-')}={found[k]}" for k in ("train_dir", "test_dir", "mask_dir", "mask_ext")]
    args = m.train.get_args(["--data-dir", str(data), *flags])
    rows = m.train.training_rows(data, args, ["rle"])
    assert len(rows) == TRAIN and all(Path(p).is_file() for p in rows["mask"])
    from PIL import Image  # 16-bit masks (0/65535): detected as '255' (PIL's getcolors refuses I;16), then refused

    for png in sorted((data / "train" / "masks").iterdir()):
        Image.fromarray((np.asarray(Image.open(png)) > 0).astype(np.uint16) * 65535).save(png)
    assert detect.detect_segmentation(data, {})["mask_values"] == "65535"
    args = m.train.get_args(["--data-dir", str(data), *flags, "--mask-values", "65535"])
    rows = m.train.training_rows(data, args, ["rle"])
    assert sum(m.train.training_mask(args, row, "binary").any() for row in rows.itertuples()) > TRAIN // 2
    (data / "train" / "masks").rename(data / "train" / "gt")  # a folder no one could guess: the flags to name it
    with pytest.raises(KagtplError, match=r"no mask folder \(train_masks, .*, train/masks\) or RLE CSV .*--mask-dir"):
        detect.detect_segmentation(data, {})
    assert detect.detect_segmentation(data, {"mask_dir": "train/gt"})["mask_ext"] == ".png"


def test_a_sample_with_an_extra_column_is_one_line_naming_the_file(tmp_path, m, shapes_data):
    """Issue 47: `id,rle,extra` passed kagtpl new, then crashed train.py with a pandas traceback
    (`sequence item 1: expected str instance, float found`). An extra column cannot be filled from
    masks: kagtpl new and train.py's preflight each say so in one line naming the file."""
    data = spoil(tmp_path, shapes_data["png"], "extra")
    sample = data / "sample_submission.csv"
    lines = sample.read_text().splitlines()
    sample.write_text("\n".join([lines[0] + ",extra", *(line + "," for line in lines[1:])]) + "\n")
    with pytest.raises(KagtplError, match=r"sample_submission.csv: columns \['id', 'rle', 'extra'\], but the masks"):
        detect.detect_segmentation(data, {})
    message = r"sample_submission.csv: columns \['id', 'rle', 'extra'\], but a binary submission has 2 \(id, rle\)"
    with pytest.raises(m.errors.DataError, match=message):
        preflight(m, data)
    # a column too few is not "an extra column": class masks with a row per image say what they need
    with pytest.raises(m.errors.DataError, match="one row per image holds one mask: class masks need a row per"):
        preflight(m, spoil(tmp_path, shapes_data["png"], "too-few"), "--mask-values", "0,255")
    rle = spoil(tmp_path, shapes_data["rle"], "extra-rle")  # the RLE layout: the same words from kagtpl new
    (rle / "sample_submission.csv").write_text("id,rle,extra\nimg0100,,\n")
    with pytest.raises(KagtplError, match="a third column cannot be filled from them"):
        detect.detect_segmentation(rle, {})


def test_preflight_names_the_line_of_a_bad_rle_row(tmp_path, m, shapes_data):
    data = spoil(tmp_path, shapes_data["rle-classes"], "rlec")
    rows = (data / "train.csv").read_text().splitlines()
    flags = ["--mask-dir", "", "--train-csv", "train.csv", "--class-col", "class"]
    rows[5] = "img0002,ellipse,9200 100"
    (data / "train.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(m.errors.DataError, match="train.csv line 6 .id img0002.: RLE run 1 ends at pixel 9299, past"):
        preflight(m, data, *flags)
    rows[5] = "img0002,triangle,"
    (data / "train.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(m.errors.DataError, match="train.csv line 6 .id img0002.: class 'triangle' is not one of"):
        preflight(m, data, *flags)
    sample = (data / "sample_submission.csv").read_text()
    ids = sorted({r.split(",")[0] for r in sample.splitlines()[1:]})
    nine = [f"{i},c{k}," for i in ids for k in range(9)]  # a bit per class in a uint8: 9 do not fit
    (data / "sample_submission.csv").write_text("\n".join(["id,class,rle", *nine]) + "\n")
    with pytest.raises(m.errors.DataError, match="sample_submission.csv: 9 classes; overlapping .* at most 8"):
        preflight(m, data, *flags)
    # an image of a row per image and class with no file: its first row's line, not its place among the images
    (data / "sample_submission.csv").write_text(sample)
    rows[5] = "img0002,ellipse,"
    rows = [r.replace("img0003,", "img9999,") for r in rows]
    (data / "train.csv").write_text("\n".join(rows) + "\n")
    line = next(k + 1 for k, r in enumerate(rows) if r.startswith("img9999,"))
    assert line > 4, rows  # the fourth image's rows: line 4 would be its place among the images
    with pytest.raises(m.errors.DataError, match=rf"img9999\.png: image not found \(train\.csv line {line}\)"):
        preflight(m, data, *flags)


def test_the_mask_cache_is_made_again_when_the_rle_table_changes(tmp_path, m, shapes_data):
    """The cache key covers the RLE table itself (by its path in the data folder), so relabelled
    masks are never read from an earlier run's cache."""
    data = spoil(tmp_path, shapes_data["rle"], "rle")
    args = m.train.get_args(["--data-dir", str(data), "--mask-dir", "", "--train-csv", "train.csv"])
    rows = m.train.training_rows(data, args, ["rle"])
    before = m.masks.files_key(m.train.mask_sources(args, rows), "binary")
    (data / "train.csv").write_text((data / "train.csv").read_text().replace("img0001,", "img0001,1 5 ", 1))
    assert m.masks.files_key(m.train.mask_sources(args, rows), "binary") != before


# ----------------------------------------------------------------------------- render and run


def check_submission(project, data, classes: int) -> None:
    sub = pd.read_csv(project / "output" / "submission.csv", dtype=str, keep_default_na=False)
    sample = pd.read_csv(data / "sample_submission.csv", dtype=str, keep_default_na=False)
    assert list(sub.columns) == list(sample.columns) and len(sub) == TEST * classes
    assert (sub[sub.columns[0]] == sample[sample.columns[0]]).all()
    for rle in sub[sub.columns[-1]]:  # each one a mask of the image's own size
        numbers = [int(v) for v in rle.split()]
        assert all(s >= 1 and s + n - 1 <= SIZE * SIZE for s, n in zip(numbers[0::2], numbers[1::2], strict=True))
    score = shapes.dice_score(
        project / "output" / "submission.csv", data.parent / f"{data.name}_solution.csv", (SIZE, SIZE)
    )
    assert 0 <= score <= 1


@pytest.mark.slow
def test_binary_png_masks_train_on_tiles_and_predict_with_the_oof_threshold(png_project, shapes_data, capsys, tmp_path):
    out = run_script(png_project, "train.py", *FAST).stdout
    assert "DATA: 24 train images" in out and "binary" in out and "64px tiles of 96px" in out
    assert "OOF: Dice@0.5=" in out and "POSTPROCESS: rle > " in out
    saved = json.loads((png_project / "output" / "postprocess.json").read_text())
    m = import_project(png_project, ("masks", "train"))
    again = m.masks.tuned_postprocess(png_project / "output", saved["signature"], ["rle"], SIZE * SIZE, "dice")
    assert again == saved and saved["folds"] == [0, 1] and saved["rows"] == TRAIN
    # postprocess.json cut short (a full disk, a copy stopped midway): chosen again on the OOF files, said as that
    chosen = png_project / "output" / "postprocess.json"
    whole = chosen.read_text()
    chosen.write_text(whole[:20])
    capsys.readouterr()
    assert m.masks.read_postprocess(png_project / "output", saved["signature"], ["rle"], SIZE * SIZE, "dice") == saved
    assert capsys.readouterr().out.rstrip().endswith(f"({chosen} does not read back: chosen now)")
    chosen.write_text(whole)
    assert f"{saved['tuned']:.4f}" in out.split("OOF: ")[1].splitlines()[0]  # the OOF line's tuned Dice
    ckpt = torch.load(png_project / "output" / "model_fold0.pth", weights_only=True)
    assert m.train.mode_of(ckpt["config"]) == "binary" and ckpt["classes"] == ["rle"]  # predict.py rebuilds from these
    predicted = run_script(png_project, "predict.py", "--device", "cpu").stdout
    assert "SUBMISSION: " in predicted and "2 fold(s) ensembled" in predicted
    check_submission(png_project, shapes_data["png"], 1)
    # a hidden test set neither the disk nor the memory holds: decoded batch by batch, the same submission
    r, streamed = predict_streamed(png_project, png_project / "output", shapes_data["png"], tmp_path)
    assert "2 fold(s) ensembled" in r.stdout and streamed == (png_project / "output" / "submission.csv").read_bytes()
    # a rerun under a budget grows seeds: a mask's OOF row is statistics, which do not average, so each
    # fold's rows are predicted again by its seeds ensembled (seeds_oof.py); they judge the seeds, and
    # postprocess.json is chosen on them while the seeds are kept (before: kept unjudged, chosen on one seed)
    grown = run_script(png_project, "train.py", *FAST, "--budget", seed_budget(png_project, 40), env=GROW_ENV).stdout
    out = png_project / "output"
    if seeds_judged(png_project, grown, "Dice"):
        first, rows = pd.read_csv(out / "oof_fold0.csv"), pd.read_csv(out / "oof_fold0_seeds.csv")
        seeds = [first] + [pd.read_csv(p) for p in sorted(out.glob("oof_fold0_seed[0-9].csv"))]
        stats = [c for c in rows.columns if ":" in c]  # rle:inter@0.10 ...
        assert rows["id"].equals(first["id"]) and len(seeds) > 1
        assert not np.allclose(rows[stats], np.mean([s[stats].to_numpy() for s in seeds], axis=0))
        both = pd.concat(
            [
                pd.read_csv(next(p for p in (out / f"oof_fold{k}_seeds.csv", out / f"oof_fold{k}.csv") if p.is_file()))
                for k in (0, 1)
            ],
            ignore_index=True,
        )
        chosen = m.masks.choose_postprocess(both["target"].to_numpy(), both[stats].to_numpy(), ["rle"], SIZE**2, "dice")
        saved = json.loads((out / "postprocess.json").read_text())
        assert (saved["classes"], saved["tuned"]) == (chosen["classes"], chosen["tuned"]), (saved, chosen)


@pytest.mark.slow  # the module's project's Competition built in-process (its caches), one model (~5 s)
def test_validation_rows_are_the_views_predict_py_averages(png_project, tmp_path):
    """predict.py averages each image with its horizontal flip (--tta, when training flipped), and
    postprocess.json's threshold is chosen on the OOF rows: they were one view's, whose threshold
    (0.75) was too high for the flip's less certain mean (0.55 on its rows). On 120 shapes images
    with 30 held out, predict.py's default submission scored Dice 0.3723 where the threshold chosen
    on the flip's rows gave 0.4585. Validation now predicts the views predict.py averages."""
    m = import_project(png_project, ("train", "masks", "engine", "artifacts", "hardware"))
    machine = m.engine.make_machine(torch.device("cpu"), "off", m.hardware.loader_settings(0, False), False)
    for hflip in (True, False):
        args = m.train.get_args(
            ["--device", "cpu", "--out-dir", str(tmp_path / f"out{hflip}"), f"--{'' if hflip else 'no-'}hflip"]
        )
        args.signature = m.artifacts.run_signature(args)
        comp = m.train.Competition(args, machine)
        fold = comp.fold(0, np.arange(4, TRAIN), np.arange(4))
        torch.manual_seed(0)
        model = comp.build_model(fold).eval()
        batch = next(iter(comp.loader(fold.valid, 4, False)))
        with torch.no_grad():
            rows = comp.predict(model, batch)
            x, mask = m.train.normalize(batch[0]), batch[1]

            def tiled(img, model=model, comp=comp):
                return m.masks.predict_tiled(
                    functools.partial(m.train.tile_probs, model, comp.mode), img, comp.tile, comp.overlap
                )

            one, both = tiled(x), (tiled(x) + tiled(x.flip(3)).flip(3)) / 2
        truth = m.masks.channels(mask, comp.mode, 1)
        stats = [m.masks.image_stats(p, truth, m.train.image_loss(p, mask, comp.mode, 1)) for p in (one, both)]
        assert torch.allclose(rows, stats[1 if hflip else 0], atol=1e-5), hflip
        assert not torch.allclose(stats[0], stats[1], atol=1e-5)  # the two views do differ here
        assert comp.valid_views == comp.test_views == (2 if hflip else 1)


def mostly_empty(dest, empty: int = 30, with_mask: int = 6):
    """A shapes competition whose training images are mostly without a mask (SIIM's pneumothorax:
    ~78%): `empty` of them and `with_mask` with one, at the module's size."""
    import cv2

    data = shapes.write_shapes(dest, "png", 5 * (empty + with_mask), TEST, SIZE, seed=1)
    kept = {True: 0, False: 0}
    for mask in sorted((data / "train_masks").iterdir()):
        is_empty = not cv2.imread(str(mask), cv2.IMREAD_GRAYSCALE).any()
        kept[is_empty] += 1
        if kept[is_empty] > (empty if is_empty else with_mask):
            mask.unlink()
            (data / "train" / mask.name).unlink()
    assert kept[True] >= empty and kept[False] >= with_mask, kept
    return data


@pytest.mark.slow
def test_folds_worse_than_the_empty_masks_hand_in_the_fallback(png_project, tmp_path):
    """Most images without a mask and one epoch: the folds' masks score below the empty masks that
    train.py's fallback holds, on the same OOF images, even at the threshold and minimum area chosen
    there. They were handed in all the same (masks were never judged: a Dice of 0.56 where the
    fallback's is 0.83); now a HAND-IN line, predict.py keeps the fallback (run.py says so), and
    kagtpl kaggle refuses to ship them."""
    data, out = mostly_empty(tmp_path / "data"), tmp_path / "out"
    where = ["--data-dir", str(data), "--out-dir", str(out)]
    log = run_script(png_project, "run.py", *FAST, *where, env=JUDGED_ENV).stdout
    assert "DATA: 36 train images (30 with empty masks)" in log, log
    oof = float(re.search(r"^OOF: Dice@0\.5=[\d.]+, Dice=([\d.]+) over 36 rows", log, re.M)[1])
    assert oof < 30 / 36, log  # the empty masks' Dice: 1 on each image without a mask, 0 on the others
    said = re.search(
        r"^HAND-IN: the fallback: the folds' OOF Dice ([\d.]+) is worse than the empty masks' 0\.8333 on the same "
        r"36 rows \(in (\d+)% of \d+ paired bootstrap resamples\); predict\.py keeps train\.py's fallback "
        r"\(hand_in\.json\)$",
        log,
        re.M,
    )
    assert said and float(said[1]) == oof and int(said[2]) >= 95, log
    assert json.loads((out / "hand_in.json").read_text())["fallback"]["what"] == "the empty masks"
    kept = f"SUBMISSION: {out / 'submission.csv'} kept: train.py's fallback (the empty masks), because the folds' "
    assert kept + f"OOF Dice {oof:.4f} is worse than the empty masks' 0.8333 ({out / 'hand_in.json'}" in log, log
    assert f"RUN: handed in {out / 'submission.csv'}, this run's fallback (the empty masks): predict.py kept it" in log
    sub = pd.read_csv(out / "submission.csv", dtype=str, keep_default_na=False)
    assert len(sub) == TEST and (sub["rle"] == "").all()
    ship = ["kaggle", str(png_project), "--user", "alice", "--no-wheels", "--competition", "shapes-comp"]
    refused = CliRunner().invoke(app, [*ship, "--no-pretrained", "--predict", "--budget", "9h", "--out-dir", str(out)])
    assert refused.exit_code == 1 and "judged its folds worse than the empty masks (OOF Dice " in refused.output
    assert "the empty masks' 0.8333" in refused.output and not (png_project / "kaggle").exists(), refused.output
    # serve.py answers every call with the empty masks too (Kaggle's evaluation API: the package's stand-in gateway)
    from test_serve import STANDIN, serve_env

    shutil.copytree(STANDIN, data / "kaggle_evaluation")
    flags = ["--device", "cpu", *where, "--data-paths", str(data / "sample_submission.csv")]
    served = run_script(png_project, "serve.py", *flags, env=serve_env(STANDIN_BATCH_ROWS=2)).stdout
    assert f"SERVE: every call is answered with the empty masks: {kept}" in served, served
    answers = pd.read_parquet(png_project / "submission.parquet")
    (png_project / "submission.parquet").unlink()  # the module's project: the file serve.py writes where it runs
    assert len(answers) == TEST and (answers["rle"] == "").all(), answers
    doctor = CliRunner().invoke(app, ["doctor", str(out / "train.log")])  # an agent's reading of the run
    assert doctor.exit_code == 1 and "STATUS: ACTION NEEDED" in doctor.output, doctor.output
    assert "HAND-IN: the run hands in train.py's fallback, not its folds: the folds' OOF Dice " in doctor.output


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "mode"), [("classes", "multiclass"), ("rle-classes", "multilabel")])
def test_class_layouts_render_train_and_predict_a_row_per_image_and_class(tmp_path, shapes_data, layout, mode):
    project = make_project(tmp_path, shapes_data[layout])
    out = run_script(project, "run.py", "--budget", "10m", "--no-grow", *FAST[2:]).stdout
    assert f"{mode}, classes ['ellipse', 'rectangle']" in out and "POSTPROCESS: ellipse > " in out
    check_submission(project, shapes_data[layout], 2)


SERVE_BOTH_CLASSES = """
import sys, time
from pathlib import Path
import pandas as pd, torch
import predict
from machinery import serving
data, out = Path(sys.argv[1]), Path("output")
sample = pd.read_csv(data / "sample_submission.csv", dtype=str)
clock = serving.StartClock(time.time(), 600)
ensemble = predict.load_ensemble(out, data, list(sample.columns), torch.device("cpu"), clock)
every, none = {"threshold": -1.0, "min_area": 0}, {"threshold": 2.0, "min_area": 0}  # a full mask, an empty one
ensemble = ensemble._replace(chosen={**ensemble.chosen, "classes": {"1": every, "2": none}})
predict.predict_batch(ensemble, {}, sample[["ImageId", "ClassId"]]).to_csv("served.csv", index=False)
# a failed call's answer (serve_defaults.json's): each row's class echoed, its mask empty
defaults = serving.read_defaults(out)
serving.fallback(sample[["ImageId", "ClassId"]], defaults, None).to_csv("fallen_back.csv", index=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("order", [["ImageId", "EncodedPixels", "ClassId"], ["ImageId", "ClassId", "EncodedPixels"]])
def test_severstals_sample_order_id_rle_class_is_read_by_name(tmp_path, shapes_data, order):
    """Severstal's sample is ImageId, EncodedPixels, ClassId: the RLE in the middle. kagtpl new took
    ClassId for the RLE column and EncodedPixels for the classes; now each is read by name and the
    submission keeps the sample's order, ClassId intact (train.py's fallback, predict.py's, and
    serve.py's answers: in either order it dropped the RLE column, then read the class from the
    sample's third column, which was gone, and gave every row the first class's mask; and a failed
    call's fallback answer, which took the last column for the mask)."""
    src, data = shapes_data["rle-classes"], tmp_path / "severstal"
    shutil.copytree(src / "train", data / "train_images")
    shutil.copytree(src / "test", data / "test_images")
    rows, number = pd.read_csv(src / "train.csv", dtype=str), {"ellipse": "1", "rectangle": "2"}
    pd.DataFrame({"ImageId": rows["id"], "ClassId": rows["class"].map(number), "EncodedPixels": rows["rle"]}).to_csv(
        data / "train.csv", index=False
    )
    ids = sorted(p.stem for p in (src / "test").iterdir())
    sample = pd.DataFrame({"ImageId": np.repeat(ids, 2), "EncodedPixels": "1 1", "ClassId": ["1", "2"] * len(ids)})
    sample = sample[order]  # Severstal's, and the usual id, class, rle
    sample.to_csv(data / "sample_submission.csv", index=False)
    found = detect.detect_segmentation(data, {})
    assert (found["rle_col"], found["class_col"]) == ("EncodedPixels", "ClassId"), found
    project = make_project(tmp_path, data)
    dry_run_into_output(project, *FAST)
    fallback = pd.read_csv(project / "output" / "submission.csv", dtype=str, keep_default_na=False)
    assert fallback.equals(sample.assign(EncodedPixels="")), fallback
    run_script(project, "predict.py", *FAST)
    sub = pd.read_csv(project / "output" / "submission.csv", dtype=str, keep_default_na=False)
    keys = ["ImageId", "ClassId"]
    assert list(sub.columns) == list(sample.columns) and sub[keys].equals(sample[keys])
    assert sub["EncodedPixels"].str.fullmatch(r"(\d+ \d+( \d+ \d+)*)?").all(), sub
    (project / "serve_both.py").write_text(SERVE_BOTH_CLASSES)
    run_script(project, "serve_both.py", str(data))
    served = pd.read_csv(project / "served.csv", dtype=str, keep_default_na=False)
    assert list(served.columns) == list(sample.columns) and served["ClassId"].tolist() == sample["ClassId"].tolist()
    assert (served["EncodedPixels"] == f"1 {SIZE * SIZE}").tolist() == (served["ClassId"] == "1").tolist(), served
    # serving.fallback took the last column for the mask: in Severstal's order every row's ClassId became the
    # fallback's first row's class, and the mask column echoed the batch
    fallen = pd.read_csv(project / "fallen_back.csv", dtype=str, keep_default_na=False)
    assert fallen[["ImageId", "ClassId"]].equals(sample[["ImageId", "ClassId"]]), fallen
    assert (fallen["EncodedPixels"] == "").all(), fallen


@pytest.mark.slow
def test_a_killed_run_resumes_with_its_finished_fold(tmp_path, shapes_data):
    project = make_project(tmp_path, shapes_data["rle"])
    proc, _ = start_until(project, ["train.py", *FAST], "FOLD 0 DONE")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (project / "output" / "submission.csv").is_file()  # the fallback: empty masks, from preflight
    out = run_script(project, "train.py", *FAST).stdout
    assert "FOLD 0: model_fold0.pth is complete, skipping (resume)" in out and "POSTPROCESS:" in out


@pytest.mark.slow
def test_run_py_fits_a_plan_of_many_times_the_budget_and_submits(tmp_path, shapes_data):
    project = make_project(tmp_path, shapes_data["png"], folds=5, epochs=60)
    budget, t0 = 30, time.time()
    log = run_script(project, "run.py", "--budget", f"{budget}s", "--device", "cpu").stdout
    wall = time.time() - t0
    assert_plan_cut_to_budget(log, wall, budget)
    assert "POSTPROCESS: rle > " in log
    check_submission(project, shapes_data["png"], 1)


# ----------------------------------------------------------------------------- kagtpl recommend --task segmentation


def test_the_decoders_activations_shrink_the_batch_and_its_accumulation_target():
    hw = hardware()
    t4, a100 = hw.PROFILES["t4"], hw.PROFILES["a100-80"]
    classify = hw.recommend(t4, "resnet34", 512)
    unet, unetpp = (
        hw.recommend(t4, "resnet34", 512, decoder="unet"),
        hw.recommend(a100, "resnet34", 512, decoder="unetplusplus"),
    )
    assert classify.batch_size == hw.MIN_GPU_BATCH and unet.batch_size == hw.MIN_DECODER_BATCH  # 9.7 -> 8, not 32
    assert (
        unet.batch_size * unet.accum_steps == hw.DECODER_EFFECTIVE_BATCH
        and "/ 2.2 for the unet decoder" in unet.why["batch_size"]
    )
    sizes = {arch: hw.recommend(a100, "resnet34", 512, decoder=arch).batch_size for arch in hw.DECODER_ACTIVATIONS}
    assert sizes["fpn"] > sizes["unet"] > sizes["unetplusplus"] == unetpp.batch_size  # by their measured activations
    assert (
        hw.segmentation_tile(t4, 1024) == (512, hw.segmentation_tile(t4, 1024)[1])
        and hw.segmentation_tile(t4, 256)[0] == 256
    )
    assert hw.segmentation_tile(hw.PROFILES["cpu"], 1024)[0] == 128 and hw.segmentation_work_size(500)[0] == 512


def test_recommend_segmentation_explains_tile_batch_and_precision(shapes_data):
    def recommend(*flags):
        return CliRunner().invoke(app, ["recommend", "--task", "segmentation", *flags], env={"COLUMNS": "250"})

    r = recommend("--gpu", "t4", "--work-size", "1024")
    assert r.exit_code == 0, r.output
    for words in ("512 px tile of the 1024 px images", "/ 2.2 for the unet decoder", "8 x 4", "fp16 autocast", "9h"):
        assert words in r.output
    r = recommend("--gpu", "a100-80", "--arch", "fpn", "--data", str(shapes_data["png"]))
    assert r.exit_code == 0, r.output
    assert "median side is 96 px -> 96 px" in r.output and "whole 96 px images" in r.output and "bf16" in r.output
    for flags, message in (
        (["--arch", "segformer"], "unknown --arch 'segformer'"),
        (["--image-size", "100"], "a multiple of 32"),
    ):
        r = recommend(*flags)
        assert r.exit_code == 1 and message in r.output


@pytest.mark.parametrize("task", ["segmentation", "detection"])
def test_kagtpl_shapes_refuses_a_folder_that_holds_files(tmp_path, task):
    """Issue 47: kagtpl shapes wrote into an existing folder without a word, leaving stale images
    a detection project then read as negatives. Like kagtpl sounds, it refuses: one red line,
    exit 1, and the folder as it was."""
    dest = tmp_path / "data"
    (dest / "train").mkdir(parents=True)
    (dest / "train" / "stale.png").write_bytes(b"an earlier run's image")
    r = CliRunner().invoke(app, ["shapes", str(dest), "--task", task])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [
        f"error: {dest} exists; kagtpl shapes never overwrites: pick another folder"
    ], r.output
    assert sorted(p.name for p in dest.rglob("*")) == ["stale.png", "train"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert CliRunner().invoke(app, ["shapes", str(empty), "--task", task, "--train", "4", "--test", "1"]).exit_code == 0
