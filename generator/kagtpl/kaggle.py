"""`kagtpl kaggle`: a project packaged as an offline Kaggle code-competition kernel.

Plain steps over one dataclass. Everything is checked first, then built in a temporary folder
inside the project and moved into place as `kaggle/` whole: a failure leaves nothing behind.
The only network call is `pip download`, and only when the project needs packages Kaggle's
image lacks (`--no-wheels` skips it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kagtpl import paths
from kagtpl.errors import KagtplError
from kagtpl.template import tasks, template_module

# Kaggle slugs (competitions, datasets, kernels): lowercase letters, digits and hyphens, 3 to 50
# characters, no hyphen at either end; anything else is rejected or rewritten by Kaggle.
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,48}[a-z0-9]$")
USER_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$")

# What Kaggle's Python image already has, of what generated projects import (the GPU image of
# 2026: torch 2.x with torchvision, timm, albumentations, OpenCV, scikit-learn, pandas, numpy,
# matplotlib, transformers, the boosters, optuna). A requirement not listed gets a wheel.
KAGGLE_IMAGE = frozenset(
    {
        "torch",
        "torchvision",
        "timm",
        "albumentations",
        "opencv-python",
        "opencv-python-headless",
        "scikit-learn",
        "pandas",
        "numpy",
        "scipy",
        "matplotlib",
        "pillow",
        "tqdm",
        "transformers",
        "tokenizers",
        "safetensors",
        "sentencepiece",
        "protobuf",
        "lightgbm",
        "xgboost",
        "catboost",
        "optuna",
        "soundfile",  # librosa's decoder
    }
)
# Kaggle's accelerators by GPU profile; other profiles are not on Kaggle and get its T4 x2
MACHINE_SHAPES = {"t4": "NvidiaTeslaT4", "t4x2": "NvidiaTeslaT4", "p100": "NvidiaTeslaP100"}
KAGGLE_PYTHON, KAGGLE_PLATFORM = "3.11", "manylinux2014_x86_64"  # the wheels pip downloads are for these
CODE_FILES = ("*.py", "requirements.txt", ".copier-answers.yml", "README.md")
CODE_PACKAGE = "machinery"  # the project's engine package: a folder, uploaded zipped (--dir-mode zip)


@dataclass
class KaggleRequest:
    path: Path
    user: str
    competition: str | None = None  # default: the project's answer
    weights: Path | None = None  # a weights file (timm), uploaded as a dataset
    model_dir: Path | None = None  # a model folder (Hugging Face), uploaded as a dataset
    budget: str | None = None  # default: the project's answer, else 9h
    pretrained: bool = True  # False: run.py gets --no-pretrained (from scratch, no weights needed)
    wheels: bool = True
    image_has: frozenset = KAGGLE_IMAGE
    # text: the base model as a Kaggle source to attach, not uploaded: a model handle
    # owner/model/framework/variation/version (Kaggle Models) or a dataset owner/slug
    base_model: str | None = None  # the seam for tests: what the image already has
    serve: bool = False  # the notebook runs serve.py (evaluation API) on the trained weights, shipped
    predict: bool = False  # the notebook runs predict.py on the trained weights, shipped, under the budget
    cpu: bool = False  # no accelerator (BirdCLEF's inference is CPU-only); predict.py gets --device cpu
    out_dir: Path | None = None  # the run folder to ship from (train.py's --out-dir); default: the project's output/


@dataclass
class Package:
    """What is built: the slugs, the packages to ship as wheels, and the commands to run."""

    project: Path
    answers: dict
    competition: str
    slugs: dict[str, str]  # code, wheels, weights, kernel -> slug
    missing: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    lora: list[Path] = field(default_factory=list)  # text: the trained LoRA checkpoints (their base must come too)
    left_out: list[str] = field(default_factory=list)  # output/ files not shipped, and why (a fold that does not load)
    runs: Path | None = None  # the run folder its trained files come from: output/, or --out-dir


MODEL_HANDLE_RE = re.compile(r"^[a-z0-9][a-z0-9-]*(/[A-Za-z0-9][A-Za-z0-9._-]*){3}/\d+$")
DATASET_RE = re.compile(r"^[a-z0-9][a-z0-9-]*/[a-z0-9][a-z0-9-]{2,49}$")
ADAPTER_FILES = ("model_fold*.pth",)  # with output/tokenizer/: what a LoRA project's weights dataset holds
# --serve: what serve.py reads from output/: the folds (a table's trees too), train.py's fallback
# values, the run's config, each model's OOF file (oof_<model>.csv: the blend's weights), and the
# OOF-chosen post-processing (segmentation's thresholds, detection's score threshold and box cap)
# and the TTA views growth chose on the OOF rows (an image project's tta_views.json)
SERVED_FILES = (
    "model_fold*.pth",
    "tree_*_fold*.*",
    "serve_defaults.json",
    "config.json",
    "oof_*.csv",
    "postprocess.json",
    "tta_views.json",
)
# --metric f1 and qwk (the registry's CHOSEN_ON_OOF): a text's labels and grades, an image's grades, are cut where
# the folds' OOF rows score best (artifacts.oof_rows); a table's blend chooses on its models' oof_<model>.csv,
# shipped anyway
CHOSEN_OOF = "oof.csv"
SERVED_BASE = "base-model"  # --serve --model-dir: the LoRA folds' base model, inside the weights dataset


def check_base_model(value: str) -> str:
    if not (MODEL_HANDLE_RE.match(value) or DATASET_RE.match(value)):
        raise KagtplError(
            f"--base-model {value!r}: give a Kaggle model handle owner/model/framework/variation/version "
            "(e.g. qwen-lm/qwen2.5/transformers/7b-instruct/1) or a dataset owner/slug"
        )
    return value


def run_folder(project: Path, out_dir: Path | None) -> Path:
    """Where the trained files are read: --out-dir (the folder a train.py --out-dir wrote), else output/."""
    if out_dir is None:
        return project / "output"
    if not out_dir.is_dir():
        raise KagtplError(f"--out-dir {out_dir}: no such folder (give the --out-dir train.py wrote)")
    return out_dir


def check_servable(project: Path, runs: Path, task: str, mode: str = "serve") -> None:
    if mode == "serve" and not (project / "serve.py").is_file():
        raise KagtplError(f"--serve: {project.name} has no serve.py (kagtpl update adds it to an older project)")
    hand_in = template_module("hand_in")
    verdict = hand_in.standing_fallback(runs)  # predict.py there keeps train.py's fallback; a notebook would not
    if verdict is not None:
        what, than = hand_in.fallback_words(verdict)  # the training prior; segmentation's: the empty masks
        raise KagtplError(
            f"--{mode}: the run in {runs} judged its folds worse than {what} (OOF {verdict['metric']} "
            f"{verdict['oof']:.4f}, {than} {verdict['prior']:.4f}: {runs / hand_in.FILE}), and the notebook "
            f"would hand them in: train again (a larger --budget), or delete {hand_in.FILE} to ship them anyway"
        )
    folds = [f for f in served_files(runs) if f.name.startswith(("model_fold", "tree_"))]  # those that load
    if not (runs / "serve_defaults.json").is_file() or not folds:
        elsewhere = " (a run written elsewhere: --out-dir DIR)" if runs == project / "output" else ""
        raise KagtplError(
            f"--{mode} ships the trained folds and none in {runs} loads: run python train.py first{elsewhere}"
        )
    if task == "text" and not (runs / "tokenizer").is_dir():
        raise KagtplError(
            f"--{mode} ships the tokenizer train.py saved and {runs / 'tokenizer'} is missing: "
            "run python train.py again (it resumes: the folds are kept)"
        )


def served_files(runs: Path, left_out: list[str] | None = None, metric: str = "") -> list[Path]:
    """The run folder's (output/'s) files serve.py loads: the model folds, serve_defaults.json, config.json, the
    models' OOF files (not each fold's: oof_fold0.csv, oof_lgbm_fold0.csv; oof.csv under f1 and qwk: CHOSEN_OOF)
    and the chosen post-processing and TTA views. A fold checkpoint that predict.py would skip (0 bytes, cut
    short, not a kagtpl checkpoint), and a grown seed that lost on the OOF rows (hand_in.json's
    verdict, which does not travel: it names the files by their modification times), is left
    out, and why goes to `left_out`."""
    found = [f for pattern in SERVED_FILES for f in sorted(runs.glob(pattern)) if f.is_file()]
    found = [f for f in found if not (f.name.startswith("oof_") and "fold" in f.name)]
    found += [runs / CHOSEN_OOF] if metric in tasks().CHOSEN_ON_OOF and (runs / CHOSEN_OOF).is_file() else []
    hand_in = template_module("hand_in")
    lost = hand_in.left_out(runs)
    kept = []
    for f in found:
        why = checkpoint_problem(f) if f.suffix == ".pth" else None
        if hand_in.is_left_out(f.name, lost):  # a booster's fold model by its test file's name
            why = "a grown seed that lost on the OOF rows (hand_in.json)"
        if why is None:
            kept.append(f)
        elif left_out is not None:
            left_out.append(f"{f.relative_to(runs.parent)}: {why}")
    return kept


def checkpoint_problem(path: Path) -> str | None:
    """Why predict.py would skip this checkpoint (storage.load_checkpoint's rules), or None when it
    loads: torch.load(weights_only=True) where torch is installed, else the zip archive's CRCs
    (torch.save writes a zip: a file cut short fails them)."""
    if path.stat().st_size == 0:
        return "0 bytes"
    try:
        import torch
    except ImportError:
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (OSError, zipfile.BadZipFile, EOFError) as e:
            return f"not whole ({type(e).__name__})"
        return None if bad is None else f"not whole ({bad} fails its check)"
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any way torch fails to read it, predict.py skips it too
        return f"does not load ({type(e).__name__})"
    if not isinstance(ckpt, dict) or not {"model", "config", "classes"} <= ckpt.keys() or not ckpt["model"]:
        return "not a kagtpl checkpoint (no model, config or classes)"
    return None


def base_mount(handle: str) -> str:
    """Where Kaggle mounts an attached source: /kaggle/input/<model>/<framework>/<variation>/<version>
    for a model, /kaggle/input/<slug> for a dataset (as a path below INPUT)."""
    parts = handle.split("/")
    return "/".join(parts[1:]) if len(parts) == 5 else parts[1]


def lora_adapters(runs: Path) -> list[Path]:
    """The run folder's trained LoRA checkpoints (adapters and head, MBs each), if any."""
    import torch

    found = []
    for path in sorted(runs.glob("model_fold*.pth")):
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # the config, not every tensor
        except Exception:  # noqa: BLE001 - an unreadable checkpoint is not shipped; predict.py would skip it too
            continue
        if isinstance(ckpt, dict) and ckpt.get("complete") and ckpt.get("config", {}).get("lora") == "on":
            found.append(path)
    return found


def check_slug(flag: str, value: str) -> str:
    if not SLUG_RE.match(value):
        raise KagtplError(
            f"{flag} {value!r}: a Kaggle slug is 3-50 lowercase letters, digits and hyphens (as in the URL), "
            "e.g. dog-breed-identification"
        )
    return value


def slugify(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def requirement_names(requirements: Path) -> list[str]:
    """Package names of a requirements.txt (versions, extras and markers dropped), normalised."""
    names = []
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            names.append(re.split(r"[<>=!~\[ ;@]", line)[0].lower().replace("_", "-"))
    return names


def missing_packages(requirements: Path, image_has: frozenset) -> list[str]:
    """The requirements Kaggle's image does not have: they travel as wheels."""
    return [name for name in requirement_names(requirements) if name not in image_has]


def plan(req: KaggleRequest) -> Package:
    """Every check, before anything is written."""
    from kagtpl.update import read_answers

    project = req.path.resolve()
    if not project.is_dir():
        raise KagtplError(f"{project}: no such project folder")
    answers = read_answers(project)
    competition = req.competition or str(answers.get("competition") or "")
    if not competition:
        raise KagtplError(
            "no competition slug: pass --competition SLUG (as in the competition's URL), or name it in kagtpl new "
            "--competition; the kernel attaches that competition's data, and without it nothing"
        )
    competition = check_slug("--competition", competition)
    if not USER_RE.match(req.user):
        raise KagtplError(f"--user {req.user!r}: a Kaggle username is lowercase letters, digits and hyphens")
    if req.weights is not None and not req.weights.is_file():
        raise KagtplError(f"--weights {req.weights}: no such file")
    if req.model_dir is not None and not req.model_dir.is_dir():
        raise KagtplError(f"--model-dir {req.model_dir}: no such folder")
    # an image model, a segmentation model's encoder (its decoder starts from scratch), or a
    # detector's backbone (a torchvision classifier's weights, or a whole COCO detector's)
    pretrained_tasks = tasks().names(pretrained=True)  # the template's registry
    wants_weights = answers.get("task") in pretrained_tasks and answers.get("pretrained") and req.pretrained
    wants_weights = wants_weights and not (req.serve or req.predict)  # nothing trains: the trained folds travel
    if req.serve and req.predict:
        raise KagtplError(
            "--serve and --predict are two kinds of notebook: serve.py answers an evaluation API, "
            "predict.py writes submission.csv; pass one"
        )
    if req.predict and not budget_seconds(req.budget or str(answers.get("budget") or "9h")):
        raise KagtplError("--predict runs predict.py by a deadline: pass --budget (BirdCLEF's CPU limit: --budget 85m)")
    runs = run_folder(project, req.out_dir)
    if req.serve or req.predict:
        check_servable(project, runs, str(answers.get("task")), "serve" if req.serve else "predict")
    if wants_weights and req.weights is None:
        raise KagtplError(
            f"{project.name} trains from pretrained {answers.get('model')} weights and Kaggle kernels run offline: "
            "pass --weights FILE (they travel as a dataset), or --no-pretrained to train from scratch"
        )
    if req.base_model is not None:
        if answers.get("task") != "text":
            raise KagtplError("--base-model is for text projects (an LLM or encoder attached from Kaggle)")
        check_base_model(req.base_model)
    lora = lora_adapters(runs) if answers.get("task") == "text" else []
    shipped = req.serve or req.predict
    if answers.get("task") == "text" and req.model_dir is None and req.base_model is None and (lora or not shipped):
        what = (
            f"{project.name}'s folds are LoRA adapters on {answers.get('model')}, which serving loads"
            if shipped
            else f"{project.name} fine-tunes {answers.get('model')} from a local folder"
        )
        raise KagtplError(
            f"{what} and Kaggle kernels run offline: pass --model-dir DIR (config, weights and tokenizer files "
            "travel as a dataset), or --base-model HANDLE (a Kaggle model or dataset to attach)"
        )
    base = slugify(str(answers.get("project_name", project.name)))[:40].strip("-")
    slugs = {kind: check_slug(f"the {kind} slug", f"{base}-{kind}") for kind in ("code", "wheels", "weights")}
    slugs["kernel"] = check_slug("the kernel slug", f"{base}-submission")
    if req.budget is not None:
        budget_seconds(req.budget)
    requirements = project / "requirements.txt"
    missing = missing_packages(requirements, req.image_has) if requirements.is_file() else []
    return Package(project, answers, competition, slugs, missing, lora=lora, runs=runs)


def budget_seconds(budget: str) -> float | None:
    """--budget (9h, 85m, 600s) in seconds, by run.py's own parser."""
    from kagtpl.template import planner

    try:
        return planner().parse_duration(budget)
    except ValueError as e:
        raise KagtplError(f"--budget: {e}") from None


def dataset_metadata(folder: Path, user: str, slug: str) -> None:
    """dataset-metadata.json; the title is the slug, so Kaggle derives the same slug from it."""
    meta = {"title": slug, "id": f"{user}/{slug}", "licenses": [{"name": "CC0-1.0"}]}
    (folder / "dataset-metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def write_code(pkg: Package, out: Path, user: str) -> None:
    code = out / "code"
    code.mkdir()
    for pattern in CODE_FILES:
        for f in sorted(pkg.project.glob(pattern)):
            if f.is_file():
                shutil.copy2(f, code / f.name)
    machinery = pkg.project / CODE_PACKAGE
    if machinery.is_dir():
        shutil.copytree(machinery, code / CODE_PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    best = pkg.runs / "best_params.json"
    if best.is_file():  # tune.py's result: on Kaggle it lands in /kaggle/working, where run.py looks for it
        shutil.copy2(best, code / best.name)
    dataset_metadata(code, user, pkg.slugs["code"])
    pkg.commands.append(f"kaggle datasets create -p {paths.shell(pkg.project / 'kaggle' / 'code')} --dir-mode zip")


def write_wheels(pkg: Package, out: Path, user: str, download: bool) -> None:
    """Wheels for Kaggle's Python and platform of the packages its image lacks; none, no folder."""
    if not pkg.missing or not download:
        return
    wheels = out / "wheels"
    wheels.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", KAGGLE_PYTHON, "--platform", KAGGLE_PLATFORM, "-d", str(wheels), *pkg.missing]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise KagtplError(f"pip download {' '.join(pkg.missing)} failed: {last} (--no-wheels skips the wheels)")
    dataset_metadata(wheels, user, pkg.slugs["wheels"])
    pkg.commands.append(f"kaggle datasets create -p {paths.shell(pkg.project / 'kaggle' / 'wheels')}")


def weights_dataset(pkg: Package, out: Path, user: str, files: list[Path], folders: dict[str, Path]) -> None:
    """out/weights/, uploaded as the weights dataset: `files` side by side, each of `folders` under its name."""
    weights = out / "weights"
    weights.mkdir()
    for path in files:
        shutil.copy2(path, weights / path.name)
    for name, folder in folders.items():
        shutil.copytree(folder, weights / name)
    dataset_metadata(weights, user, pkg.slugs["weights"])
    pkg.commands.append(f"kaggle datasets create -p {paths.shell(pkg.project / 'kaggle' / 'weights')} --dir-mode zip")


def write_weights(pkg: Package, out: Path, req: KaggleRequest) -> str | None:
    """The weights file or model folder as a dataset; returns the path inside it the run reads.
    With --base-model the base is attached, not uploaded: the dataset holds the project's trained
    LoRA adapters (and its tokenizer), which run.py finds complete and predicts from. With --serve
    it holds what serve.py loads from output/: the folds, a text project's tokenizer, and LoRA
    folds' base model when --model-dir names it (a plain fold's checkpoint holds its whole model)."""
    tokenizer = pkg.runs / "tokenizer"
    tokenizers = {"tokenizer": tokenizer} if tokenizer.is_dir() else {}
    if req.serve or req.predict:
        shipped_base = pkg.lora and req.model_dir is not None and req.base_model is None
        base = {SERVED_BASE: req.model_dir} if shipped_base else {}
        served = served_files(pkg.runs, pkg.left_out, str(pkg.answers.get("metric", "")))
        weights_dataset(pkg, out, req.user, served, {**tokenizers, **base})
        return None
    if req.base_model is not None:
        if pkg.lora:
            weights_dataset(pkg, out, req.user, pkg.lora, tokenizers)
        return None
    if req.weights is not None:
        weights_dataset(pkg, out, req.user, [req.weights], {})
        return req.weights.name
    if req.model_dir is not None:
        weights_dataset(pkg, out, req.user, [], {req.model_dir.name: req.model_dir})
        return req.model_dir.name
    return None


def kernel_metadata(
    pkg: Package, user: str, datasets: list[str], base_model: str | None = None, cpu: bool = False
) -> dict:
    gpu = "cpu" if cpu else str(pkg.answers.get("gpu", "t4x2"))
    meta = {
        "id": f"{user}/{pkg.slugs['kernel']}",
        "title": pkg.slugs["kernel"],
        "code_file": "notebook.ipynb",
        "language": "python",
        "kernel_type": "notebook",
        "is_private": True,
        "enable_gpu": gpu != "cpu",
        "enable_tpu": False,
        "enable_internet": False,
        "dataset_sources": [f"{user}/{slug}" for slug in datasets],
        "competition_sources": [pkg.competition],
        "kernel_sources": [],
        "model_sources": [],
    }
    if base_model and MODEL_HANDLE_RE.match(base_model):
        meta["model_sources"].append(base_model)
    elif base_model:
        meta["dataset_sources"].append(base_model)
    if gpu != "cpu":
        meta["machine_shape"] = MACHINE_SHAPES.get(gpu, "NvidiaTeslaT4")
    return meta


NOTEBOOK_SETUP = '''import os, shutil, subprocess, sys
from pathlib import Path

ROOT = Path(os.environ.get("KAGGLE_ROOT", "/kaggle"))  # tests move the whole tree
INPUT, WORK = ROOT / "input", ROOT / "working"


def dataset(name):
    """An attached dataset's folder, by name: /kaggle/input/<name> or one level or two deeper."""
    for pattern in (name, f"*/{name}", f"*/*/{name}"):
        for found in sorted(INPUT.glob(pattern)):
            if found.is_dir():
                return found
    raise FileNotFoundError(f"dataset {name!r} is not attached: add it in the notebook's Data panel")
'''


def notebook(
    pkg: Package,
    budget: str,
    weights_inside: str | None,
    wheels: bool,
    run_flags: list[str],
    base: str | None = None,
    adapters: bool = False,
    mode: str = "run",
) -> dict:
    """`mode`: run (run.py trains and predicts), serve (serve.py on the shipped folds) or predict
    (predict.py on the shipped folds, under the budget's deadline)."""
    import nbformat

    what = {
        "serve": "`serve.py` answers the competition's evaluation API with the trained folds (the dataset "
        f"`{pkg.slugs['weights']}`)",
        "predict": f"`predict.py` predicts the test with the trained folds (the dataset `{pkg.slugs['weights']}`) "
        f"under a {budget} deadline and always leaves `/kaggle/working/submission.csv`",
        "run": f"`run.py` trains under a {budget} budget and always leaves `/kaggle/working/submission.csv`",
    }[mode]
    started = (
        "import time\nSTARTED = time.time()  # the deadline counts from the notebook's start\n" if mode != "run" else ""
    )
    title = {"serve": "serve", "predict": "predict", "run": "train and submit"}[mode]
    cells = [
        nbformat.v4.new_markdown_cell(
            f"# {pkg.answers.get('project_name', pkg.project.name)}: {title}, "
            f"offline\n\nMade by `kagtpl kaggle`. Competition `{pkg.competition}`; the code is the dataset "
            f"`{pkg.slugs['code']}`. {what}."
        ),
        nbformat.v4.new_code_cell(
            started
            + NOTEBOOK_SETUP
            + "# the competition this kernel's metadata attaches: train.py, predict.py and serve.py read its data\n"
            + f'os.environ["KAGTPL_COMPETITION"] = "{pkg.competition}"\n'
            + f'CODE = dataset("{pkg.slugs["code"]}")\nprint("code:", CODE)'
        ),
    ]
    if wheels:
        cells.append(
            nbformat.v4.new_code_cell(
                "# the packages Kaggle's image lacks, from the wheels dataset (internet is off)\n"
                f'wheels = dataset("{pkg.slugs["wheels"]}")\n'
                'subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), '
                f"*{pkg.missing!r}], check=True)"
            )
        )
    shipped = (
        f"the trained folds, serve_defaults.json (a text project's tokenizer too), where {mode}.py reads them"
        if mode != "run"
        else "the trained LoRA adapters and tokenizer: complete folds, so run.py goes straight to predict.py"
    )
    weights_flag = "[]"
    if weights_inside is not None:
        flag = "--model-dir" if str(pkg.answers.get("task")) == "text" else "--weights"
        weights_flag = f"[f\"{flag}={{dataset('{pkg.slugs['weights']}') / '{weights_inside}'}}\"]"
    if base is not None:  # the attached base model (adapters, when shipped, are copied where run.py looks)
        weights_flag = f"[f\"--model-dir={{INPUT / '{base_mount(base)}'}}\"]"
    if mode != "run" and not pkg.lora:
        weights_flag = "[]"  # the folds hold their whole model
    elif mode != "run" and base is None:  # LoRA folds' base model, shipped inside the weights dataset
        weights_flag = f"[f\"--model-dir={{dataset('{pkg.slugs['weights']}') / '{SERVED_BASE}'}}\"]"
    ignored = ("dataset-metadata.json", SERVED_BASE) if mode != "run" else ("dataset-metadata.json",)
    cells += [
        nbformat.v4.new_code_cell(
            "# the project's code next to its outputs: /kaggle/working is the one folder kept\n"
            "WORK.mkdir(parents=True, exist_ok=True)\n"
            "for f in CODE.iterdir():\n"
            "    if f.is_file() and f.name != 'dataset-metadata.json':\n"
            "        shutil.copy(f, WORK / f.name)\n"
            f"# {CODE_PACKAGE}/ (the engine): Kaggle unpacks the zipped folder; unpack it here if it did not\n"
            f"if (CODE / '{CODE_PACKAGE}').is_dir():\n"
            f"    shutil.copytree(CODE / '{CODE_PACKAGE}', WORK / '{CODE_PACKAGE}', dirs_exist_ok=True)\n"
            f"elif (CODE / '{CODE_PACKAGE}.zip').is_file():\n"
            f"    shutil.unpack_archive(CODE / '{CODE_PACKAGE}.zip', WORK / '{CODE_PACKAGE}')\n"
            "os.chdir(WORK)"
            + (
                f"\n# {shipped}\n"
                f"shutil.copytree(dataset('{pkg.slugs['weights']}'), WORK, dirs_exist_ok=True, "
                f"ignore=shutil.ignore_patterns{ignored!r})"
                if adapters or mode != "run"
                else ""
            )
        ),
        *{
            "serve": lambda: serve_cells(weights_flag),
            "predict": lambda: predict_cells(budget, budget_seconds(budget), weights_flag, run_flags),
            "run": lambda: run_cells(budget, weights_flag, run_flags),
        }[mode](),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def serve_cells(model_flag: str) -> list:
    """serve.py in the notebook's own kernel, as Kaggle's examples run their inference server:
    during the rerun (KAGGLE_IS_COMPETITION_RERUN) it answers the gateway until the session ends;
    otherwise it is a dry run of the package's local gateway on the public test files.
    `model_flag`: a list expression, [] or LoRA folds' --model-dir."""
    import nbformat

    return [
        nbformat.v4.new_code_cell(
            "# the ensemble is loaded once, then every batch the gateway sends is answered (serve.py's docstring)\n"
            "sys.path.insert(0, str(WORK))\n"
            "import serve\n\n"
            f'serve.main([f"--started={{STARTED}}", *{model_flag}])'
        ),
        nbformat.v4.new_code_cell(
            "import pandas as pd\n\n"
            "# the dry run's answers, as the local gateway wrote them\n"
            'sub = pd.read_parquet(WORK / "submission.parquet")\n'
            'print(f"submission.parquet: {len(sub)} rows, columns {list(sub.columns)[:6]}")\n'
            "sub.head()"
        ),
    ]


def streamed(command: str) -> str:
    """A cell's code that runs `command` (a list expression, in WORK) and shows each line as it
    comes (hours of silence otherwise), keeping them in run.log."""
    return (
        f"cmd = {command}\n"
        'with open(WORK / "run.log", "w") as log:\n'
        "    run = subprocess.Popen(cmd, cwd=WORK, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)\n"
        "    for line in run.stdout:\n"
        '        print(line, end="", flush=True)\n'
        "        log.write(line)\n"
        "        log.flush()\n"
        "    code = run.wait()\n"
    )


SUBMISSION_CELL = (
    "import pandas as pd\n\n"
    'sub = pd.read_csv(WORK / "submission.csv")\n'
    'print(f"submission.csv: {len(sub)} rows, columns {list(sub.columns)[:6]}")\n'
    "sub.head()"
)


def run_cells(budget: str, weights_flag: str, run_flags: list[str]) -> list:
    import nbformat

    return [
        nbformat.v4.new_code_cell(
            "# train, then predict, under one budget: always a submission (run.py's docstring).\n"
            f"weights = {weights_flag} + {run_flags!r}\n"
            + streamed(f'[sys.executable, "run.py", "--budget={budget}", *weights]')
            + 'print(f"run.py exited {code}")'
        ),
        nbformat.v4.new_code_cell(SUBMISSION_CELL),
    ]


def predict_cells(budget: str, seconds: float, model_flag: str, flags: list[str]) -> list:
    """predict.py on the shipped folds, by the deadline `seconds` after the notebook's start."""
    import nbformat

    return [
        nbformat.v4.new_code_cell(
            f"# predict the test with the shipped folds by {budget} after the notebook's start: the best folds\n"
            "# that fit, measured on the first test batches (predict.py's docstring)\n"
            f"flags = {model_flag} + {flags!r}\n"
            + streamed(f'[sys.executable, "predict.py", f"--deadline={{STARTED + {seconds:.0f}}}", *flags]')
            + 'print(f"predict.py exited {code}")'
        ),
        nbformat.v4.new_code_cell(SUBMISSION_CELL),
    ]


def build(req: KaggleRequest) -> Package:
    """Check, then write kaggle/ in a temporary folder and move it into place whole."""
    import nbformat

    pkg = plan(req)
    staging = Path(tempfile.mkdtemp(dir=pkg.project, prefix=".kaggle."))
    try:
        write_code(pkg, staging, req.user)
        write_wheels(pkg, staging, req.user, req.wheels)
        weights_inside = write_weights(pkg, staging, req)
        datasets = [pkg.slugs[k] for k in ("code", "wheels", "weights") if (staging / k).is_dir()]
        meta = kernel_metadata(pkg, req.user, datasets, req.base_model, req.cpu)
        (staging / "kernel-metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
        budget = req.budget or str(pkg.answers.get("budget") or "9h")
        flags = ["--device=cpu"] if req.cpu else []
        if not (req.pretrained or req.predict):  # predict.py trains nothing: no weights flag
            flags.insert(0, "--no-pretrained")
        adapters = req.base_model is not None and (staging / "weights").is_dir()  # write_weights shipped them
        wheels = (staging / "wheels").is_dir()
        mode = "serve" if req.serve else "predict" if req.predict else "run"
        nb = notebook(pkg, budget, weights_inside, wheels, flags, req.base_model, adapters, mode)
        nbformat.write(nb, staging / "notebook.ipynb")
        staging.chmod(0o755)  # mkdtemp makes it private
        target = pkg.project / "kaggle"
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    pkg.commands.append(f"kaggle kernels push -p {paths.shell(pkg.project / 'kaggle')}")
    return pkg
