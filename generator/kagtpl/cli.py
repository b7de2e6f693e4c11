"""kagtpl's command line: wiring only. Each command calls plain functions; a KagtplError
becomes one red line on stderr and exit code 1."""

from __future__ import annotations

import sys
from functools import wraps
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from kagtpl import (
    __version__,
    check,
    demo,
    doctor,
    gpus,
    kaggle,
    new,
    paths,
    recommend,
    shapes,
    sounds,
    summary,
    table,
    update,
)
from kagtpl.errors import KagtplError
from kagtpl.template import tasks as template_tasks

try:  # Typer >= 0.20 carries its own copy of Click
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # older Typer runs on Click itself
    from click.exceptions import NoArgsIsHelpError, UsageError

# the template's task registry (machinery/tasks.py): each task's name and what it trains
TASK_HELP = "Competition type: " + "; ".join(f"{t.name} ({t.what})" for t in template_tasks().TASKS) + "."
app = typer.Typer(
    help="Kaggle competition projects that keep the GPU busy and always hand in a submission.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain Click help: NAME and TEXT, wrapped to the terminal (no <str> / {name} boxes)
)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def show(table) -> None:
    Console().print(table)  # the terminal's width (COLUMNS); 80 when the output is not a terminal


def boundary(fn):
    """The one place a KagtplError turns into a red line and exit code 1."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KagtplError as e:
            err.print(f"[red]error: {e}[/red]", markup=True)
            raise typer.Exit(1) from None

    return wrapper


def run() -> None:
    """The `kagtpl` command. Click's usage errors (a bad option value, a missing argument, an
    unknown option) become one red line and exit 1 like every other error, not a box and exit 2."""
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as e:  # plain `kagtpl`: the help, as before
        print(e.ctx.get_help() if e.ctx else "kagtpl --help")
        code = 0
    except UsageError as e:
        err.print(
            f"error: {e.format_message()} (kagtpl {e.ctx.command_path.split(' ', 1)[-1] if e.ctx else ''} --help)",
            style="red",
            markup=False,
        )
        code = 1
    except typer.Abort:  # EOF at a prompt
        code = 130
    if code == 130:  # Ctrl-C (Typer returns 130 for a KeyboardInterrupt): one line; each command writes nothing
        err.print("interrupted (Ctrl-C): nothing was written", style="red", markup=False)
    sys.exit(code if isinstance(code, int) else 0)


def _version(value: bool) -> None:
    if value:
        print(f"kagtpl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = None,
) -> None:
    """kagtpl: render, train, predict."""


@app.command("new")
@boundary
def new_cmd(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Project folder name, e.g. dog-breed.")],
    task: Annotated[
        Optional[str],
        typer.Option(metavar="TASK", help=TASK_HELP),
    ] = None,
    gpu: Annotated[
        Optional[str], typer.Option(metavar="GPU", help="GPU profile (kagtpl gpus), or auto to detect.")
    ] = None,
    data: Annotated[
        Optional[Path], typer.Option(metavar="DIR", help="Competition data folder; its layout is detected.")
    ] = None,
    model: Annotated[
        Optional[str], typer.Option(metavar="MODEL", help="timm model name (image); Hugging Face name (text).")
    ] = None,
    model_dir: Annotated[
        Optional[str],
        typer.Option(metavar="DIR", help="Text: the local Hugging Face model folder (on Kaggle, an attached dataset)."),
    ] = None,
    image_size: Annotated[
        Optional[int], typer.Option(metavar="IMAGE_SIZE", help="Square input size in pixels.")
    ] = None,
    folds: Annotated[Optional[int], typer.Option(metavar="FOLDS", help="Cross-validation folds.")] = None,
    epochs: Annotated[Optional[int], typer.Option(metavar="EPOCHS", help="Max epochs per fold.")] = None,
    batch_size: Annotated[
        Optional[int], typer.Option(metavar="BATCH_SIZE", help="Batch size; default: the rule for the GPU.")
    ] = None,
    budget: Annotated[
        Optional[str],
        typer.Option(
            metavar="BUDGET", help="Wall time for train + predict: 9h, 45m, 600s (default 9h on Kaggle GPUs)."
        ),
    ] = None,
    competition: Annotated[
        Optional[str],
        typer.Option(
            metavar="SLUG", help="Kaggle competition slug, as in its URL; kagtpl kaggle needs it (or its own flag)."
        ),
    ] = None,
    labels_csv: Annotated[
        Optional[str], typer.Option(metavar="LABELS_CSV", help="Override the detected labels CSV.")
    ] = None,
    id_col: Annotated[Optional[str], typer.Option(metavar="ID_COL", help="Override the detected id column.")] = None,
    label_col: Annotated[
        Optional[str], typer.Option(metavar="LABEL_COL", help="Override the detected label column ('' = one class).")
    ] = None,
    file_col: Annotated[
        Optional[str],
        typer.Option(metavar="COL", help="Audio: the metadata CSV's column naming each clip's file (filename, fname)."),
    ] = None,
    train_dir: Annotated[
        Optional[str], typer.Option(metavar="TRAIN_DIR", help="Override the detected training image (or audio) folder.")
    ] = None,
    test_dir: Annotated[
        Optional[str], typer.Option(metavar="TEST_DIR", help="Override the detected test image folder.")
    ] = None,
    image_ext: Annotated[
        Optional[str],
        typer.Option(metavar="IMAGE_EXT", help="Override the detected image extension ('': images named by their id)."),
    ] = None,
    sample_submission: Annotated[
        Optional[str], typer.Option(metavar="SAMPLE_SUBMISSION", help="Override the sample submission CSV.")
    ] = None,
    submission: Annotated[
        Optional[str],
        typer.Option(
            metavar="KIND",
            help="Image: what submission.csv holds: auto (from the sample), probs, label, positive (one column of "
            "the second class's probability: AUC on 0/1 labels, where the sample holds 0s), or number (the label "
            "is a score: a regression, RMSE).",
        ),
    ] = None,
    train_csv: Annotated[
        Optional[str], typer.Option(metavar="TRAIN_CSV", help="Tables: override the training table.")
    ] = None,
    test_csv: Annotated[
        Optional[str], typer.Option(metavar="TEST_CSV", help="Tables: override the test table.")
    ] = None,
    target: Annotated[
        Optional[str],
        typer.Option(
            metavar="TARGET",
            help="Tables, text: override the detected target column (a text's several score columns: found alone).",
        ),
    ] = None,
    text_cols: Annotated[
        Optional[str], typer.Option(metavar="COLS", help="Text: override the detected text column(s), comma-separated.")
    ] = None,
    problem: Annotated[
        Optional[str],
        typer.Option(
            metavar="PROBLEM", help="binary, multiclass or regression; text: multilabel too (0/1 label columns)."
        ),
    ] = None,
    metric: Annotated[
        Optional[str],
        typer.Option(
            metavar="METRIC",
            help="Tables and text: logloss, accuracy, auc, f1, mcc, rmse, rmsle, mae, qwk or map3 (default: inferred); "
            "images: logloss, accuracy, auc, rmse or qwk (default: the submission's); masks: dice or iou; boxes: map, "
            "map50 or wheat; audio: auc or cmap.",
        ),
    ] = None,
    mask_dir: Annotated[
        Optional[str], typer.Option(metavar="DIR", help="Segmentation: mask files' folder ('' = RLE in --train-csv).")
    ] = None,
    mask_ext: Annotated[
        Optional[str],
        typer.Option(metavar="EXT", help="Segmentation: what a mask's name adds to its image's id: .png, _mask.gif."),
    ] = None,
    mask_values: Annotated[
        Optional[str],
        typer.Option(metavar="VALUES", help="Segmentation: mask values, '255' binary or '1,2,3' classes."),
    ] = None,
    missing_mask: Annotated[
        Optional[str], typer.Option(metavar="RULE", help="Segmentation: an image without a mask: error or empty.")
    ] = None,
    rle_col: Annotated[Optional[str], typer.Option(metavar="COL", help="Segmentation: the RLE column.")] = None,
    class_col: Annotated[
        Optional[str], typer.Option(metavar="COL", help="Segmentation: the class column of the RLE CSV ('' = none).")
    ] = None,
    rle_order: Annotated[
        Optional[str],
        typer.Option(metavar="F|C", help="Segmentation: RLE pixel order, F column-major (default), C rows."),
    ] = None,
    rle_start: Annotated[
        Optional[int], typer.Option(metavar="1|0", help="Segmentation: the first pixel's number (default detected).")
    ] = None,
    arch: Annotated[
        Optional[str],
        typer.Option(
            metavar="ARCH",
            help="Segmentation: unet, unetplusplus, fpn or deeplabv3plus; detection: fasterrcnn, retinanet or fcos.",
        ),
    ] = None,
    box_cols: Annotated[
        Optional[str],
        typer.Option(metavar="COLS", help="Detection: four box columns (x,y,w,h) or one holding box lists (bbox)."),
    ] = None,
    box_format: Annotated[
        Optional[str], typer.Option(metavar="FMT", help="Detection: xywh (COCO), xyxy (corners) or cxcywh (YOLO).")
    ] = None,
    box_scale: Annotated[
        Optional[str], typer.Option(metavar="SCALE", help="Detection: pixel or relative box coordinates.")
    ] = None,
    box_classes: Annotated[
        Optional[str], typer.Option(metavar="NAMES", help="Detection: the labels, comma-separated (default: found).")
    ] = None,
    missing_boxes: Annotated[
        Optional[str],
        typer.Option(metavar="RULE", help="Detection: a training image with no row: empty (a negative) or skip."),
    ] = None,
    pred_style: Annotated[
        Optional[str],
        typer.Option(metavar="STYLE", help="Detection: string (id, PredictionString) or rows (a row per box)."),
    ] = None,
    pred_fields: Annotated[
        Optional[str],
        typer.Option(
            metavar="FIELDS",
            help="Detection: a box's fields, in order ('score x y w h'; rows: the columns after the id).",
        ),
    ] = None,
    pred_scale: Annotated[
        Optional[str], typer.Option(metavar="SCALE", help="Detection: the submission's coordinates, pixel or relative.")
    ] = None,
    work_size: Annotated[
        Optional[int], typer.Option(metavar="PX", help="Segmentation: every image resized to this (default: detected).")
    ] = None,
    dest: Annotated[Path, typer.Option(metavar="DEST", help="Parent folder of the new project.")] = Path("."),
    force: Annotated[bool, typer.Option(help="Render into an existing non-empty folder.")] = False,
) -> None:
    """Render a new competition project (non-interactive when flags are given)."""
    overrides = {
        "labels_csv": labels_csv,
        "id_col": id_col,
        "label_col": label_col,
        "file_col": file_col,
        "train_dir": train_dir,
        "test_dir": test_dir,
        "image_ext": image_ext,
        "sample_submission": sample_submission,
        "submission": submission,
        "train_csv": train_csv,
        "test_csv": test_csv,
        "target": target,
        "problem": problem,
        "text_cols": text_cols,
        "mask_dir": mask_dir,
        "mask_ext": mask_ext,
        "mask_values": mask_values,
        "missing_mask": missing_mask,
        "rle_col": rle_col,
        "class_col": class_col,
        "rle_order": rle_order,
        "rle_start": rle_start,
        "arch": arch,
        "box_cols": box_cols,
        "box_format": box_format,
        "box_scale": box_scale,
        "box_classes": box_classes,
        "missing_boxes": missing_boxes,
        "pred_style": pred_style,
        "pred_fields": pred_fields,
        "pred_scale": pred_scale,
    }
    answers = new.NewAnswers(
        name=name,
        task=task,
        competition=competition,
        gpu=gpu,
        data=data,
        model=model,
        model_dir=model_dir,
        image_size=image_size,
        work_size=work_size,
        folds=folds,
        epochs=epochs,
        batch_size=batch_size,
        budget=budget,
        metric=metric,
        dest=dest,
        force=force,
        layout=overrides,
    )
    target = new.new_project(answers)
    print("\n".join(summary.lines(update.read_answers(target))))
    cd = f"cd {paths.shell(target)}"  # a folder with a space or a quote: the commands still run as written
    print(f"Created {target}\nNext: {cd} && python train.py --dry-run && python train.py && python predict.py")
    if not new.in_git(target):
        print(
            f"Updates (kagtpl check / kagtpl update) merge into a git repository: {cd} && git init && "
            "git add -A && git commit -m 'kagtpl new'"
        )


@app.command("gpus")
@boundary
def gpus_cmd() -> None:
    """List the GPU profiles and what each records."""
    show(gpus.gpus_table())


@app.command("recommend")
@boundary
def recommend_cmd(
    task: Annotated[
        str,
        typer.Option(metavar="TASK", help=TASK_HELP),
    ] = "image",
    gpu: Annotated[str, typer.Option(metavar="GPU", help="GPU profile (kagtpl gpus).")] = "t4",
    model: Annotated[
        Optional[str], typer.Option(metavar="MODEL", help="timm model name; text: a Hugging Face name.")
    ] = None,
    max_len: Annotated[
        Optional[int], typer.Option(metavar="MAX_LEN", help="Text: tokens per text (default: the profile's cap).")
    ] = None,
    image_size: Annotated[
        Optional[int],
        typer.Option(
            metavar="IMAGE_SIZE", help="Square input size in pixels (default: the profile's, or from --data)."
        ),
    ] = None,
    budget: Annotated[
        Optional[str], typer.Option(metavar="BUDGET", help="Time budget: 9h, 45m, 600s (Kaggle GPUs: 9h).")
    ] = None,
    data: Annotated[
        Optional[Path], typer.Option(metavar="DIR", help="Competition data: the image size from its images.")
    ] = None,
    arch: Annotated[
        Optional[str],
        typer.Option(
            metavar="ARCH",
            help="Segmentation: unet (default), unetplusplus, fpn or deeplabv3plus; "
            "detection: fasterrcnn (GPU default), retinanet or fcos (CPU default).",
        ),
    ] = None,
    work_size: Annotated[
        Optional[int],
        typer.Option(metavar="PX", help="Segmentation: the size images are resized to (default: from --data)."),
    ] = None,
    model_dir: Annotated[
        Optional[Path],
        typer.Option(metavar="DIR", help="Text: a Hugging Face folder; its config.json gives the size (LLMs: LoRA)."),
    ] = None,
) -> None:
    """Print the settings kagtpl would choose, and why."""
    if task == "text":
        show(recommend.text_table(gpu, model, max_len, budget, model_dir))
        return
    if task == "segmentation":
        show(recommend.segmentation_table(gpu, model, arch or "unet", image_size, work_size, budget, data))
        return
    if task == "detection":
        show(recommend.detection_table(gpu, model, arch, image_size, budget, data))
        return
    if task == "audio":
        show(recommend.audio_table(gpu, model, budget))
        return
    show(recommend.recommend_table(task, gpu, model, image_size, budget, data))


@app.command("table")
@boundary
def table_cmd(
    dest: Annotated[
        Path, typer.Argument(metavar="DEST", help="Folder to write train.csv, test.csv and the submission template.")
    ],
    kind: Annotated[
        str, typer.Option(metavar="KIND", help="binary, binary-label, multiclass, multiclass-label or regression.")
    ] = "binary",
) -> None:
    """Write a small real table competition (from scikit-learn's datasets) to try --task tabular on."""
    print(f"Wrote {table.write_table(dest.resolve(), kind)}")


@app.command("shapes")
@boundary
def shapes_cmd(
    dest: Annotated[Path, typer.Argument(metavar="DEST", help="Folder to write the images, masks and sample into.")],
    layout: Annotated[
        Optional[str],
        typer.Option(
            metavar="LAYOUT",
            help="Masks: png (default), rle, classes or rle-classes; "
            "boxes: wheat (default), voc, lists, strings or rows.",
        ),
    ] = None,
    train: Annotated[int, typer.Option(metavar="N", help="Training images.")] = 120,
    test: Annotated[int, typer.Option(metavar="N", help="Test images.")] = 30,
    size: Annotated[int, typer.Option(metavar="PX", help="Image side in pixels.")] = 96,
    task: Annotated[
        str,
        typer.Option(
            metavar="TASK", help="segmentation (masks) or detection (boxes: wheat, voc, lists, strings, rows)."
        ),
    ] = "segmentation",
) -> None:
    """Write a small segmentation or detection competition (shapes on cluttered backgrounds) to try kagtpl on."""
    if task not in ("segmentation", "detection"):
        raise KagtplError(f"--task {task!r}: segmentation or detection")
    if task == "detection":
        print(f"Wrote {shapes.write_boxes(dest.resolve(), layout or 'wheat', train, test, size)}")
        return
    print(f"Wrote {shapes.write_shapes(dest.resolve(), layout or 'png', train, test, size)}")


@app.command("sounds")
@boundary
def sounds_cmd(
    dest: Annotated[Path, typer.Argument(metavar="DEST", help="Folder for the clips, soundscapes and sample.")],
    layout: Annotated[
        str,
        typer.Option(
            metavar="LAYOUT",
            help="folders (train_audio/<label>/, test soundscapes), csv (BirdCLEF's train_metadata.csv with "
            "secondary labels) or clips (a test row per clip).",
        ),
    ] = "folders",
    clips: Annotated[int, typer.Option(metavar="N", help="Training clips per word (label).")] = 8,
    test: Annotated[int, typer.Option(metavar="N", help="Test soundscapes (clips: test clips).")] = 3,
    windows: Annotated[int, typer.Option(metavar="N", help="5-second windows per soundscape.")] = 4,
    seed: Annotated[int, typer.Option(metavar="N", help="The random seed: the same seed writes the same set.")] = 0,
    style: Annotated[
        str,
        typer.Option(
            metavar="STYLE",
            help="kagtpl (5 words, 6 voices, pink noise: the set the audio defaults were chosen on) or unheard "
            "(8 other words, other voices, hum, tones and unlabelled words behind them): check a recipe on both.",
        ),
    ] = "kagtpl",
) -> None:
    """Write a small audio competition (words spoken by espeak-ng over noise, BirdCLEF's layout) to try kagtpl on."""
    print(f"Wrote {sounds.write_sounds(dest.resolve(), layout, clips, test, windows, seed, style)}")


@app.command("demo")
@boundary
def demo_cmd(
    dest: Annotated[Path, typer.Argument(metavar="DEST", help="Folder for the demo data and project.")] = Path(
        "kagtpl-demo"
    ),
    force: Annotated[bool, typer.Option(help="Reuse an existing non-empty folder.")] = False,
) -> None:
    """End to end on CPU: write the built-in digits dataset, render, train, predict, score."""
    demo.run_demo(dest.resolve(), force)


@app.command("kaggle")
@boundary
def kaggle_cmd(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="The project.")] = Path("."),
    user: Annotated[str, typer.Option(metavar="USERNAME", help="Your Kaggle username (dataset and kernel ids).")] = "",
    competition: Annotated[
        Optional[str],
        typer.Option(metavar="SLUG", help="Competition slug, as in its URL (default: kagtpl new --competition's)."),
    ] = None,
    weights: Annotated[
        Optional[Path], typer.Option(metavar="FILE", help="Pretrained weights to upload as a dataset.")
    ] = None,
    model_dir: Annotated[
        Optional[Path], typer.Option(metavar="DIR", help="A model folder (text) to upload as a dataset.")
    ] = None,
    budget: Annotated[
        Optional[str],
        typer.Option(metavar="BUDGET", help="run.py's budget in the notebook (default: the project's, else 9h)."),
    ] = None,
    pretrained: Annotated[
        bool, typer.Option(help="Train from the --weights (default); --no-pretrained: from scratch.")
    ] = True,
    wheels: Annotated[bool, typer.Option(help="pip download wheels of what Kaggle's image lacks.")] = True,
    base_model: Annotated[
        Optional[str],
        typer.Option(
            metavar="HANDLE",
            help="Text: the model to attach, not upload (owner/model/framework/variation/version, or a dataset "
            "owner/slug); trained LoRA adapters ship as the weights dataset.",
        ),
    ] = None,
    serve: Annotated[
        bool,
        typer.Option(
            help="Evaluation-API competitions: the notebook runs serve.py on the trained folds (shipped as the "
            "weights dataset) instead of run.py.",
        ),
    ] = False,
    predict: Annotated[
        bool,
        typer.Option(
            help="Competitions scored on submission.csv from a hidden test (BirdCLEF): the notebook runs predict.py "
            "on the trained folds (shipped as the weights dataset) by --budget after its start, instead of run.py.",
        ),
    ] = False,
    cpu: Annotated[
        bool,
        typer.Option(help="The notebook runs without an accelerator (BirdCLEF's inference is CPU-only): --device cpu."),
    ] = False,
    out_dir: Annotated[
        Optional[Path],
        typer.Option(metavar="DIR", help="The run to ship (train.py's --out-dir; default: the project's output/)."),
    ] = None,
) -> None:
    """Package the project as an offline Kaggle kernel: datasets, notebook, metadata, commands."""
    if not user:
        raise KagtplError("--user USERNAME is needed: the datasets and the kernel are ids USERNAME/slug")
    request = kaggle.KaggleRequest(
        path,
        user,
        competition,
        weights,
        model_dir,
        budget,
        pretrained,
        wheels,
        base_model=base_model,
        serve=serve,
        predict=predict,
        cpu=cpu,
        out_dir=out_dir,
    )
    pkg = kaggle.build(request)
    for why in pkg.left_out:
        print(f"Left out of the weights dataset (predict.py would skip it): {why}")
    print(f"Wrote {pkg.project / 'kaggle'}; upload and run, in this order:")
    for command in pkg.commands:
        print(f"  {command}")
    if pkg.missing and not wheels:
        print(
            f"Note: Kaggle's image lacks {', '.join(pkg.missing)}; without --wheels the notebook will not install them"
        )


@app.command("update")
@boundary
def update_cmd(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="The project (a git repository with no uncommitted changes).")
    ] = Path("."),
    to: Annotated[
        Optional[str], typer.Option(metavar="VERSION", help="Template version, e.g. 0.2.0 (default: this kagtpl's).")
    ] = None,
    data: Annotated[
        Optional[list[str]],
        typer.Option(metavar="KEY=VALUE", help="Change an answer, e.g. --data gpu=a100-80 (repeatable)."),
    ] = None,
) -> None:
    """Merge a newer template into an existing project, keeping your edits; exit 1 on conflicts."""
    old, new, conflicts = update.update_project(update.UpdateRequest(path, to, update.parse_data(data or [])))
    did_change = bool(conflicts) or update.changed(path.resolve())
    print(update.outcome_line(path.resolve(), old, new, did_change))
    if conflicts:
        raise KagtplError(
            f"the update left conflicts in {', '.join(conflicts)}: resolve the <<<<<<< / >>>>>>> blocks (and *.rej), "
            "then commit; or undo it all with git reset --hard && git clean -fd"
        )
    if did_change:
        print("No conflicts. Review with git diff, then commit.")


@app.command("check")
@boundary
def check_cmd(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="The project.")] = Path("."),
) -> None:
    """Say whether a newer template version than the project's exists."""
    current, newer = check.check_project(path)
    if newer and newer.startswith("HEAD"):  # a source checkout: its newest commit, not a release
        print(f"Template {newer} is available (project is on {current}): run kagtpl update --to HEAD {path}")
    elif newer:
        print(f"Template {newer} is available (project is on {current}): run kagtpl update {path}")
    else:
        print(f"Up to date: the project is on template {current}")


@app.command("doctor")
@boundary
def doctor_cmd(
    log: Annotated[
        Optional[Path],
        typer.Argument(
            metavar="[LOG]",
            help="A training log (ours, or any with the field notes' print formats; a .jsonl is read as "
            "train_log.jsonl). Default: output/train.log, else output/train_log.jsonl, in this folder.",
        ),
    ] = None,
    model: Annotated[
        Optional[str], typer.Option(metavar="MODEL", help="Model name, for logs without a Model: line.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable report for agents.")] = False,
    plot: Annotated[
        Optional[Path], typer.Option(metavar="PNG", help="Also draw loss, metric and GPU memory % to this PNG.")
    ] = None,
) -> None:
    """Apply the GPU decision matrix to a log: exit 0 if OK, 1 if action is needed."""
    raise typer.Exit(doctor.run(log, model, json_out, plot))
