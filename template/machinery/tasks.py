"""The task registry: every competition type kagtpl renders, and what each needs, in one place.

Pure Python, no torch: kagtpl's generator imports this same file (`kagtpl.template.tasks()`), so
`kagtpl new`, `kagtpl recommend`, `kagtpl kaggle` and the generated project's planner read one
list. copier.yml's `task` choices and its folds/epochs defaults are checked against it by
tests/test_contract.py. Adding a task: its entry here, its scripts and modules under template/
(each named by the Jinja condition on the task's name), its questions in copier.yml, and its docs
(docs/generated-project.md, "Adding a task"). It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str
    folds: int  # the plan's default folds and epochs (copier.yml's defaults; planner.DEFAULT_PLAN)
    epochs: int
    pretrained: bool  # trains from pretrained weights a Kaggle kernel cannot download (kagtpl kaggle: --weights)
    image_size: bool  # reads images at a size it is given (--image-size)
    what: str  # one line, for kagtpl new's help and errors
    # what train.py's fallback submission holds for every row, in words: the HAND-IN line's, predict.py's,
    # serve.py's and run.py's (a run's folds that score worse than it on their OOF rows are not handed in)
    fallback: str = "the training prior"

    @property
    def carries_answers(self) -> bool:
        """Whether serve.py answers a failed call with the last good answer's values (each column's
        mean, or its most common value): a prior over rows, yes. A mask or a box belongs to its own
        image: another image's pasted on this one scores below none, so those answer the fallback."""
        return self.fallback == PRIOR


TASKS = (
    Task("image", 5, 10, True, True, "image classification (timm)"),
    Task("tabular", 5, 50, False, False, "tables: LightGBM, XGBoost, CatBoost and an MLP, blended"),
    Task("text", 5, 4, False, False, "text: transformers encoders, decoder LLMs with LoRA"),
    Task("segmentation", 5, 20, True, True, "masks (segmentation_models_pytorch), RLE submissions", "the empty masks"),
    Task("detection", 5, 20, True, True, "boxes (torchvision detectors), weighted box fusion", "no boxes"),
    Task("audio", 5, 20, True, False, "audio: spectrogram CNNs over windows of recordings"),
)
PRIOR = Task.fallback  # class frequencies, each tag's share or the mean: every fallback but masks' and boxes'
BY_NAME = {task.name: task for task in TASKS}
NAMES = tuple(BY_NAME)
# the image files the image-reading tasks read (what OpenCV decodes): kagtpl new detects by them, and
# train.py, predict.py and serve.py read an image under another of them than --image-ext as it is
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
# a table's or a text's metrics by problem, in one place: kagtpl new's detection and the generated train.py's
# check (metrics.check_flags) read them; copier.yml's metric validator says the same in Jinja
PROBLEM_METRICS = {
    "binary": ("auc", "logloss", "accuracy", "f1", "mcc"),
    "multiclass": ("logloss", "accuracy", "auc", "map3"),
    "regression": ("rmse", "rmsle", "mae", "qwk"),
    "multilabel": ("auc", "logloss"),  # a text's only
}
TABLE_ONLY_METRICS = ("rmsle", "mae")
LABELS_ONLY_METRICS = ("f1", "mcc", "map3")  # scored on the labels handed in: --submission label
TOP_LABELS = 3  # map3: the labels a row hands in, the likeliest first
# the metrics whose labels predict.py and serve.py choose on the OOF rows: F1's cut of the positive class
# (metrics.with_threshold), QWK's cuts of a score into grades (grades.with_cuts); kagtpl kaggle ships the rows
CHOSEN_ON_OOF = ("f1", "qwk")
# an image's metrics by what its submission holds, the first its default (--metric auto): kagtpl new and the
# generated train.py check --metric against them. auc: ROC AUC of the positive class (Histopathologic, SIIM-ISIC),
# or each class's averaged (Plant Pathology's mean column-wise AUC); it ranks runs, picks tune.py's trials and
# judges the folds against the fallback (hand_in.py), as log loss did for every probability submission
IMAGE_METRICS = {
    "probs": ("logloss", "auc"),
    "positive": ("logloss", "auc"),
    "label": ("accuracy",),
    "number": ("rmse", "qwk"),  # qwk: whole grades (APTOS's 0-4), learned as a score, handed in rounded
}


def get(name: str) -> Task:
    """The task called `name`; a KeyError names the valid ones."""
    if name not in BY_NAME:
        raise KeyError(f"unknown task {name!r}; valid tasks: {', '.join(NAMES)}")
    return BY_NAME[name]


def names(**needs: bool) -> tuple[str, ...]:
    """The tasks whose fields equal `needs`: names(pretrained=True) -> the tasks that need weights."""
    return tuple(t.name for t in TASKS if all(getattr(t, key) == value for key, value in needs.items()))
