"""`kagtpl new`: plain steps over one dataclass of answers. Every check runs before
anything is written; rendering goes to a temporary folder that is moved into place whole."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from kagtpl import detect, detect_audio, kaggle, paths
from kagtpl.errors import KagtplError
from kagtpl.template import hardware, planner, profiles, source, tasks, text_sizing

TASKS = tasks().NAMES  # the template's task registry (machinery/tasks.py)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class NewAnswers:
    name: str
    task: str | None = None
    competition: str | None = None  # the Kaggle slug; default: the project name
    gpu: str | None = None
    data: Path | None = None
    model: str | None = None
    model_dir: str | None = None  # text: the local Hugging Face folder
    image_size: int | None = None
    work_size: int | None = None  # segmentation: the size every image is resized to
    folds: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    budget: str | None = None
    metric: str | None = None
    dest: Path = Path(".")
    force: bool = False
    layout: dict[str, str | None] = field(default_factory=dict)

    @property
    def target(self) -> Path:
        return (self.dest / self.name).resolve()

    @property
    def interactive(self) -> bool:
        """Copier asks the questions only when no flag answered them and a person is there."""
        return self.task is None and self.gpu is None and sys.stdin.isatty()


MAX_NAME = 100  # file names stop at 255 bytes; the staging folder's name adds the pid and a suffix


def validate_name(answers: NewAnswers) -> None:
    if not answers.name or ".." in answers.name or not NAME_RE.match(answers.name):
        raise KagtplError(
            f"invalid project name {answers.name!r}: use letters, digits, '-', '_' and '.', no path separators or '..'"
        )
    if len(answers.name) > MAX_NAME:
        raise KagtplError(f"project name of {len(answers.name)} characters: at most {MAX_NAME}")


def validate_choices(answers: NewAnswers) -> None:
    if answers.task is not None and answers.task not in TASKS:
        raise KagtplError(f"unknown task {answers.task!r}; valid tasks: {', '.join(TASKS)}")
    valid = [*hardware().PROFILES, "auto"]
    if answers.gpu is not None and answers.gpu not in valid:
        raise KagtplError(f"unknown GPU {answers.gpu!r}; valid GPUs: {', '.join(valid)}")
    for key, (low, high) in hardware().RANGES.items():
        value = getattr(answers, key)
        if value is not None and not low <= value <= high:
            raise KagtplError(f"--{key.replace('_', '-')} {value}: must be between {low} and {high}")
    for key in ("image_size", "work_size"):
        value = getattr(answers, key)
        problem = value is not None and hardware().stride_problem(f"--{key.replace('_', '-')}", value)
        if answers.task in ("segmentation", "detection") and problem:
            raise KagtplError(problem)
    if answers.competition is not None:
        kaggle.check_slug("--competition", answers.competition)
    if answers.budget is not None:
        try:
            planner().parse_duration(answers.budget)
        except ValueError as e:
            raise KagtplError(f"--budget: {e}") from None


SMI_QUERIES = ("name,memory.total,compute_cap", "name,memory.total")  # compute_cap: drivers from 2021 on


def detect_gpu(smi_output: str | None = None) -> str:
    """Profile of the local GPU from nvidia-smi ('cpu' when there is none). An unlisted card gets
    the nearest listed profile (same precision, nearest memory) and a warning on stderr. The seam
    for tests is `smi_output`: the text of `nvidia-smi --query-gpu=name,memory.total,compute_cap
    --format=csv,noheader,nounits` (the capability column may be missing)."""
    if smi_output is None:
        smi_output = ""
        for query in SMI_QUERIES:
            try:
                smi_output = subprocess.run(
                    ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=True,
                ).stdout
                break
            except (OSError, subprocess.SubprocessError):
                continue
    fields = [f.strip() for f in (smi_output.strip().splitlines() or [""])[0].split(",")]
    if len(fields) < 2:
        return "cpu"
    try:
        mem_gb = float(fields[1]) / 1024
        capability = tuple(int(x) for x in fields[2].split(".")) if len(fields) > 2 else None
    except ValueError:
        return "cpu"
    cards = profiles()
    listed = cards.profile_from_gpu_name(fields[0], mem_gb)
    if listed != "cpu":
        return listed
    nearest = cards.nearest_profile(mem_gb, capability or (8, 0))
    print(
        f"warning: GPU {fields[0]!r} ({mem_gb:.0f} GB) is not in kagtpl's table: using the nearest profile "
        f"{nearest!r}; train.py --gpu auto builds one from the card itself",
        file=sys.stderr,
    )
    return nearest


def check_destination(answers: NewAnswers) -> None:
    target = answers.target
    if target.exists() and not target.is_dir():
        raise KagtplError(f"destination {target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not answers.force:
        raise KagtplError(f"destination {target} exists and is not empty; pass --force to render into it")
    paths.check_writable_folder(target.parent, "--dest")


# flags that only some tasks take: the tasks, and what the error says otherwise
FOR_TASK = {
    "model": (
        ("image", "text", "segmentation", "detection", "audio"),
        "for image, segmentation and audio (timm), detection (a torchvision ResNet) and text (Hugging Face) "
        "competitions; tables get an MLP",
    ),
    "model_dir": (("text",), "for text competitions (the local Hugging Face folder)"),
    "image_size": (tasks().names(image_size=True), "for image, segmentation and detection competitions"),
    "work_size": (("segmentation",), "for segmentation competitions"),
}
DETECTORS = {
    "image": (detect.detect_image, detect.LAYOUT_KEYS),
    "tabular": (detect.detect_tabular, detect.TABULAR_KEYS),
    "text": (detect.detect_text, detect.TEXT_KEYS),
    "segmentation": (detect.detect_segmentation, detect.SEGMENTATION_KEYS),
    "detection": (detect.detect_detection, detect.DETECTION_KEYS),
    "audio": (detect_audio.detect_audio, detect_audio.AUDIO_KEYS),
}


def copier_data(answers: NewAnswers) -> dict:
    """Answers for Copier: flags given, plus the data layout detected from --data."""
    data: dict = {"project_name": answers.name}
    if answers.competition is not None:
        data["competition"] = answers.competition
    if answers.task is not None:
        data["task"] = answers.task
    if answers.gpu is not None:
        data["gpu"] = detect_gpu() if answers.gpu == "auto" else answers.gpu
    task = answers.task or "image"
    for key in ("model", "model_dir", "image_size", "work_size", "folds", "epochs", "batch_size", "budget"):
        if getattr(answers, key) is not None and key in FOR_TASK and task not in FOR_TASK[key][0]:
            raise KagtplError(f"--{key.replace('_', '-')} is {FOR_TASK[key][1]}")
        if getattr(answers, key) is not None:
            data[key] = getattr(answers, key)
    if answers.model_dir is not None and answers.model is None:  # the record names the folder's model, not the default
        named = text_sizing().hub_name(answers.model_dir)
        if named is not None:
            data["model"] = named
    overrides = {**answers.layout, "metric": answers.metric}
    if overrides.get("submission") is not None and task != "image":  # tables and text: --metric decides it
        raise KagtplError("--submission is for image competitions; tables and text write labels with --metric accuracy")
    if overrides.get("submission") not in (None, *detect.IMAGE_SUBMISSIONS):
        raise KagtplError(f"--submission {overrides['submission']!r}: one of {', '.join(detect.IMAGE_SUBMISSIONS)}")
    detector, keys = DETECTORS[task]
    if answers.data is not None:
        folder = paths.data_folder(answers.data)
        data["data_dir"] = str(folder)
        data.update(detector(folder, overrides))
        if task == "image" and answers.image_size is None:  # small images: do not upscale them 16x
            profile = hardware().PROFILES[data.get("gpu", hardware().DEFAULT_PROFILE)]
            data["image_size"], why = detect.image_size(folder, data, profile)
            print(f"Image size: {data['image_size']} px ({why}; --image-size overrides)")
        if task == "segmentation":
            segmentation_sizes(folder, data, answers)
        if task == "detection" and answers.image_size is None:
            detection_size(folder, data)
    else:
        data.update({k: v for k, v in overrides.items() if v is not None and k in keys})
    return data


def segmentation_sizes(folder: Path, data: dict, answers: NewAnswers) -> None:
    """The working size and the training tile, by the template's rules (hardware.segmentation_work_size
    and segmentation_tile), unless given."""
    hw = hardware()
    side = detect.median_side(folder / data["train_dir"], data["image_ext"])
    work = answers.work_size or hw.segmentation_work_size(side)[0]
    data["work_size"] = work
    if answers.image_size is None:
        data["image_size"] = hw.segmentation_tile(hw.PROFILES[data.get("gpu", hw.DEFAULT_PROFILE)], work)[0]
    tiles = "whole images" if data.get("image_size", work) >= work else f"{data['image_size']} px tiles"
    print(
        f"Image size: {work} px working size ({'median side ' + str(int(side)) if side else 'no image read'}), {tiles}"
    )


DETECTION_MAX_SIZE = {"gpu": 1024, "cpu": 256}  # a 1024 px step costs 4x a 512 px one; CPU: 16x a 256 px one


def detection_side(side: float | None, device: str) -> tuple[int, str]:
    """The square every image is resized to: the training images' median side, a multiple of 32,
    at most DETECTION_MAX_SIZE (small objects vanish when a 1024 px scan is shrunk to 256 px)."""
    cap = DETECTION_MAX_SIZE[device]
    if not side:
        size = 128 if device == "cpu" else 512
        return size, f"no image read: the {device} default"
    size = int(max(64, min(cap, side // 32 * 32)))
    return size, f"median side {int(side)}, a multiple of 32, at most {cap} on a {device}"


def detection_size(folder: Path, data: dict) -> None:
    side = detect.median_side(folder / data["train_dir"], data["image_ext"])
    if side:
        data["image_size"] = detection_side(side, "cpu" if data.get("gpu") == "cpu" else "gpu")[0]
        print(f"Image size: {data['image_size']} px (median side {int(side)}; --image-size overrides)")


def render(answers: NewAnswers, data: dict) -> Path:
    """Render into a temporary sibling folder, then move it into place: a failure leaves nothing."""
    import copier
    from copier.errors import CopierAnswersInterrupt, CopierError, DirtyLocalWarning

    src = source()
    target = answers.target
    created = paths.made_parents(target.parent)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        paths.sweep_staging(target.parent, answers.name)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{answers.name}.{os.getpid()}.") as tmp:
            staging = Path(tmp) / answers.name
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DirtyLocalWarning)  # a source checkout with uncommitted changes
                copier.run_copy(
                    src.path,
                    staging,
                    data=data,
                    defaults=not answers.interactive,
                    unsafe=False,
                    quiet=True,
                    vcs_ref=src.ref,
                )
            if target.exists():
                shutil.copytree(staging, target, dirs_exist_ok=True)
            else:
                staging.rename(target)
    except CopierAnswersInterrupt:  # Ctrl-C at a question: its str() is Copier's whole answers map
        paths.remove_empty(created)
        raise KeyboardInterrupt from None
    except (CopierError, ValueError) as e:
        paths.remove_empty(created)
        raise KagtplError(f"copier could not render the template: {str(e).splitlines()[0]}") from e
    except OSError as e:
        paths.remove_empty(created)
        raise KagtplError(f"cannot write {target}: {e.strerror or e}") from e
    except BaseException:  # Ctrl-C: the staging folder is gone with its context; leave no empty parents
        paths.remove_empty(created)
        raise
    return target


def new_project(answers: NewAnswers) -> Path:
    validate_name(answers)
    validate_choices(answers)
    check_destination(answers)
    data = copier_data(answers)
    return render(answers, data)


def in_git(path: Path) -> bool:
    """Whether `path` is inside a git work tree (kagtpl update needs one to merge and undo)."""
    try:
        r = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True
        )
    except OSError:
        return False
    return r.returncode == 0 and r.stdout.strip() == "true"
