"""copier.yml restates a few facts of the template's own modules (the GPU names, the Kaggle
profiles and budget, the numeric ranges, the default plan): these tests keep the two in step,
so neither side can drift. They render copier.yml's own Jinja, as Copier does."""

from __future__ import annotations

import subprocess
import sys

import jinja2
import pytest
import yaml

from conftest import ROOT
from kagtpl import new
from kagtpl.template import hardware, planner, tasks

COPIER = yaml.safe_load((ROOT / "copier.yml").read_text())


def jinja(text, **answers) -> str:
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(str(text)).render(**answers).strip()


def test_gpu_choices_are_the_profiles():
    assert COPIER["gpu"]["choices"] == list(hardware().PROFILES)
    assert COPIER["gpu"]["default"] == hardware().DEFAULT_PROFILE


@pytest.mark.parametrize("gpu", list(hardware().PROFILES))
def test_default_image_size_is_the_profiles(gpu):
    expected = hardware().image_size_for(hardware().PROFILES[gpu], None)[0]
    assert int(jinja(COPIER["image_size"]["default"], gpu=gpu, task="image")) == expected
    tile = hardware().SEGMENTATION_TILE["gpu" if hardware().PROFILES[gpu].is_gpu else "cpu"]  # segmentation: the tile
    assert int(jinja(COPIER["image_size"]["default"], gpu=gpu, task="segmentation")) == tile


def test_task_choices_are_the_generators():
    assert tuple(COPIER["task"]["choices"]) == new.TASKS


@pytest.mark.parametrize("gpu", list(hardware().PROFILES))
def test_kaggle_profiles_get_the_kaggle_budget_and_input(gpu):
    kaggle = gpu in hardware().KAGGLE_PROFILES
    assert jinja(COPIER["budget"]["default"], gpu=gpu) == (planner().KAGGLE_BUDGET if kaggle else "")
    data_dir = jinja(COPIER["data_dir"]["default"], gpu=gpu, competition="comp")
    assert data_dir == ("/kaggle/input/comp" if kaggle else "data")


@pytest.mark.parametrize("key", list(hardware().RANGES))
def test_validators_enforce_the_ranges(key):
    low, high = hardware().RANGES[key]
    validator = COPIER[key]["validator"]
    assert jinja(validator, task="image", **{key: low}) == "" and jinja(validator, task="image", **{key: high}) == ""
    assert (
        jinja(validator, task="image", **{key: low - 1}) != ""
        and jinja(validator, task="image", **{key: high + 1}) != ""
    )


def test_copier_yml_offers_the_registrys_tasks_and_the_generator_knows_each():
    """machinery/tasks.py is the one list of tasks (issue 58): copier.yml's choices, kagtpl new's
    names and layout detectors, kagtpl kaggle's weights rule and the planner's defaults all read it
    or are checked against it here. A task added to one and not the others fails this test."""
    registry = tasks()
    assert COPIER["task"]["choices"] == list(registry.NAMES)
    assert new.TASKS == registry.NAMES and set(new.DETECTORS) == set(registry.NAMES)
    assert set(planner().DEFAULT_PLAN) == set(registry.NAMES)
    for task in registry.TASKS:  # the template renders each task's own scripts under its name
        for script in ("train.py{% endif %}.jinja", "predict.py{% endif %}"):
            assert (ROOT / "template" / f"{{% if task == '{task.name}' %}}{script}").is_file(), (task.name, script)
    assert registry.names(pretrained=True) == ("image", "segmentation", "detection", "audio")
    assert registry.names(image_size=True) == ("image", "segmentation", "detection")


@pytest.mark.parametrize("task", new.TASKS)
def test_default_plan_is_the_planners(task):
    folds, epochs = planner().DEFAULT_PLAN[task]
    assert int(jinja(COPIER["folds"]["default"], task=task)) == folds
    assert int(jinja(COPIER["epochs"]["default"], task=task)) == epochs


def test_shared_modules_import_no_torch():
    """planner.py, hardware.py, logs.py, experiments.py, submission.py and storage.py import no torch:
    the generator loads the first two, and experiments.py must run where torch is slow to import."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from machinery import planner, hardware, logs, experiments, errors, submission, storage; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "template")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_metric_validator_says_what_the_registry_s_metric_rules_say():
    """copier.yml's metric validator is Jinja: it restates machinery/tasks.py's rules (IMAGE_METRICS
    by what an image submission holds; PROBLEM_METRICS by a table's or a text's problem, the labels-only
    metrics on a label submission). Every pair it accepts is one the registry does, and no other."""
    validator, choices = COPIER["metric"]["validator"], COPIER["metric"]["choices"]
    for submission, fits in tasks().IMAGE_METRICS.items():
        for metric in choices:
            said = jinja(validator, task="image", metric=metric, submission=submission, problem="binary")
            assert (said == "") == (metric in ("auto", *fits)), (submission, metric, said)
    for task in ("tabular", "text"):
        for problem, fits in tasks().PROBLEM_METRICS.items():
            for submission in ("probs", "label"):
                for metric in choices:
                    said = jinja(validator, task=task, metric=metric, submission=submission, problem=problem)
                    fit = metric in fits and (metric not in tasks().LABELS_ONLY_METRICS or submission == "label")
                    fit = fit and not (task == "text" and metric in tasks().TABLE_ONLY_METRICS)
                    assert (said == "") == fit, (task, problem, submission, metric, said)
