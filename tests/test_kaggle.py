"""`kagtpl kaggle`: the hand-in package. Its metadata, its wheel list, its errors, and its
notebook really run by a Jupyter kernel (nbclient) in a Kaggle tree simulated under a temp dir
(KAGGLE_ROOT), offline, on CPU, to a valid submission.csv."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from conftest import RUN_ENV, render, run_script
from kagtpl import kaggle, new, shapes


def kagtpl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kagtpl", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture()
def project(tmp_path, digits_dir):
    return render(
        tmp_path / "digits-proj", data_dir=str(digits_dir), gpu="t4", competition="digits-comp", folds=2, epochs=2
    )


def test_the_package_has_the_metadata_kaggle_needs(project, tmp_path):
    weights = tmp_path / "resnet18.safetensors"
    weights.write_bytes(b"weights")
    r = kagtpl("kaggle", str(project), "--user", "alice", "--weights", str(weights), "--no-wheels", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = project / "kaggle"
    meta = json.loads((out / "kernel-metadata.json").read_text())
    assert meta["id"] == "alice/digits-proj-submission" and meta["code_file"] == "notebook.ipynb"
    assert (meta["language"], meta["kernel_type"], meta["enable_internet"]) == ("python", "notebook", False)
    assert meta["enable_gpu"] is True and meta["machine_shape"] == "NvidiaTeslaT4"
    assert meta["competition_sources"] == ["digits-comp"]
    assert meta["dataset_sources"] == ["alice/digits-proj-code", "alice/digits-proj-weights"]
    for folder, slug in (("code", "digits-proj-code"), ("weights", "digits-proj-weights")):
        assert json.loads((out / folder / "dataset-metadata.json").read_text())["id"] == f"alice/{slug}"
    code = {p.name for p in (out / "code").iterdir()}
    assert {"train.py", "predict.py", "run.py", "machinery", ".copier-answers.yml"} <= code
    assert "output" not in code and not any("=" in name for name in code)  # Kaggle's upload strips '='
    assert (out / "weights" / "resnet18.safetensors").read_bytes() == b"weights"
    nbformat.validate(nbformat.read(out / "notebook.ipynb", as_version=4))
    lines = r.stdout.splitlines()
    assert lines[1].strip() == f"kaggle datasets create -p {out / 'code'} --dir-mode zip"  # machinery/ is a folder
    assert lines[-1].strip() == f"kaggle kernels push -p {out}"
    assert not list(project.glob(".kaggle.*"))  # the staging folder is gone


def test_the_commands_printed_run_as_written_where_the_folder_holds_a_space(tmp_path, digits_dir):
    """`kaggle datasets create -p /home/a/my work/proj/kaggle/code` handed the CLI two arguments:
    every printed command quotes its folder for the shell."""
    project = render(tmp_path / "my work" / "digits-proj", data_dir=str(digits_dir), competition="digits-comp")
    weights = tmp_path / "resnet18.safetensors"
    weights.write_bytes(b"weights")
    r = kagtpl("kaggle", str(project), "--user", "alice", "--weights", str(weights), "--no-wheels", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    commands = [shlex.split(line) for line in r.stdout.splitlines() if line.strip().startswith("kaggle ")]
    out = project / "kaggle"
    assert [c[c.index("-p") + 1] for c in commands] == [str(out / "code"), str(out / "weights"), str(out)], r.stdout
    assert all(Path(c[c.index("-p") + 1]).is_dir() for c in commands)


def test_a_segmentation_project_ships_its_encoder_weights_and_the_smp_wheel(tmp_path):
    """smp is not in Kaggle's image: its wheel (for Kaggle's Python, really downloaded) travels as a
    dataset the notebook installs from offline; the encoder's weights are asked for as for images."""
    data = shapes.write_shapes(tmp_path / "shapes", "png", 8, 2, 64)
    answers = new.NewAnswers(
        name="seg-proj", task="segmentation", gpu="t4", data=data, competition="shapes-comp", dest=tmp_path
    )
    project = new.new_project(answers)
    r = kagtpl("kaggle", str(project), "--user", "alice", cwd=tmp_path)
    assert r.returncode == 1 and "trains from pretrained resnet34 weights" in r.stderr
    weights = tmp_path / "resnet34.safetensors"
    weights.write_bytes(b"weights")
    r = kagtpl("kaggle", str(project), "--user", "alice", "--weights", str(weights), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = project / "kaggle"
    assert [w.name.split("-")[0] for w in (out / "wheels").glob("*.whl")] == ["segmentation_models_pytorch"]
    meta = json.loads((out / "kernel-metadata.json").read_text())
    assert meta["dataset_sources"] == ["alice/seg-proj-code", "alice/seg-proj-wheels", "alice/seg-proj-weights"]
    cells = "\n".join(c.source for c in nbformat.read(out / "notebook.ipynb", as_version=4).cells)
    assert "'segmentation-models-pytorch'" in cells and "--weights=" in cells
    assert {"masks.py", "images.py"} <= {p.name for p in (out / "code" / "machinery").iterdir()}


def test_a_detection_project_ships_its_backbone_weights_and_no_wheel(tmp_path):
    """torchvision's detectors are in Kaggle's image: no wheel; the backbone's weights (offline)
    are asked for as for images, and the box machinery travels with the code."""
    data = shapes.write_boxes(tmp_path / "boxes", "voc", 8, 2, 64)
    answers = new.NewAnswers(
        name="det-proj", task="detection", gpu="t4", data=data, competition="boxes-comp", dest=tmp_path
    )
    project = new.new_project(answers)
    r = kagtpl("kaggle", str(project), "--user", "alice", cwd=tmp_path)
    assert r.returncode == 1 and "trains from pretrained resnet50 weights" in r.stderr
    assert not (project / "kaggle").exists()
    weights = tmp_path / "resnet50.pth"
    weights.write_bytes(b"weights")
    r = kagtpl("kaggle", str(project), "--user", "alice", "--weights", str(weights), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = project / "kaggle"
    assert not list(out.glob("wheels/*.whl"))
    meta = json.loads((out / "kernel-metadata.json").read_text())
    assert meta["dataset_sources"] == ["alice/det-proj-code", "alice/det-proj-weights"]
    assert meta["competition_sources"] == ["boxes-comp"]
    cells = "\n".join(c.source for c in nbformat.read(out / "notebook.ipynb", as_version=4).cells)
    assert "--weights=" in cells
    shipped = {p.name for p in (out / "code" / "machinery").iterdir()}
    assert {"boxes.py", "box_metrics.py", "detectors.py", "images.py"} <= shipped


def test_the_wheel_list_is_what_the_image_lacks(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(
        "# a comment\ntorch>=2.3,<=2.14.1\nlightgbm>=4  # boosters\nScikit_Learn>=1.3\nrich[jupyter]>=13\n"
        "polars ; python_version >= '3.10'\n"
    )
    fake_image = frozenset({"torch", "scikit-learn"})
    assert kaggle.missing_packages(requirements, fake_image) == ["lightgbm", "rich", "polars"]
    assert kaggle.missing_packages(requirements, kaggle.KAGGLE_IMAGE) == ["rich", "polars"]


def _bad_requirement(project: Path) -> None:
    with open(project / "requirements.txt", "a") as f:
        f.write("kagtpl-no-such-package-0000>=1\n")


def _no_slug(project: Path) -> None:
    """A project made without --competition: kagtpl new records none (the name only stands in)."""
    answers = project / ".copier-answers.yml"
    answers.write_text(answers.read_text().replace("competition: digits-comp", "competition: ''"))


def _folds_worse_than_the_prior(project: Path) -> None:
    """A run whose folds lost to the training prior on the OOF rows (hand_in.py): predict.py there
    keeps train.py's fallback; a notebook shipping the folds would hand them in."""
    import torch

    out = project / "output"
    out.mkdir()
    torch.save({"model": {"w": torch.zeros(4)}, "config": {}, "classes": ["a"]}, out / "model_fold0.pth")
    (out / "serve_defaults.json").write_text("{}")
    judged = {"model_fold0.pth": (out / "model_fold0.pth").stat().st_mtime_ns}
    verdict = {"metric": "logloss", "oof": 4.76, "prior": 2.3, "checkpoints": judged}
    (out / "hand_in.json").write_text(json.dumps({"fallback": verdict}))


ERRORS = [
    (["--no-pretrained"], _no_slug, "no competition slug: pass --competition SLUG (as in the competition's URL)"),
    (["--competition", "Dog Breed!"], None, "--competition 'Dog Breed!': a Kaggle slug is 3-50 lowercase"),
    (["--weights", "missing.safetensors"], None, "--weights missing.safetensors: no such file"),
    ([], None, "--user USERNAME is needed"),
    (["--budget", "soon", "--no-pretrained"], None, "--budget: cannot read budget 'soon'"),
    (["--no-pretrained"], _bad_requirement, "pip download kagtpl-no-such-package-0000 failed"),
    ([], None, "trains from pretrained test_resnet weights and Kaggle kernels run offline: pass --weights FILE"),
    (["--serve", "--predict"], None, "--serve and --predict are two kinds of notebook"),
    (["--predict", "--budget", "none"], None, "--predict runs predict.py by a deadline: pass --budget"),
    (["--predict", "--budget", "9h"], None, "--predict ships the trained folds and none in"),
    (["--serve", "--out-dir", "nope"], None, "--out-dir nope: no such folder (give the --out-dir train.py wrote)"),
    (
        ["--predict", "--budget", "9h"],
        _folds_worse_than_the_prior,
        "judged its folds worse than the training prior (OOF logloss 4.7600, the prior's 2.3000",
    ),
]


def test_the_weights_dataset_takes_what_serve_and_predict_read_and_no_fold_oof(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    names = ["model_fold0.pth", "model_fold0_seed2.pth", "serve_defaults.json", "config.json", "tta_views.json"]
    names += ["postprocess.json", "oof_lgbm.csv", "tree_lgbm_fold0.json"]
    for name in [*names, "oof_fold0.csv", "oof_lgbm_fold0.csv", "train_log.jsonl", "submission.csv"]:
        (out / name).write_text("x")
    import torch

    for name in ("model_fold0.pth", "model_fold0_seed2.pth", "model_fold1.pth", "model_fold2.pth"):
        torch.save({"model": {"w": torch.zeros(64)}, "config": {}, "classes": ["a"]}, out / name)
    (out / "model_fold1.pth").write_bytes(b"")  # issue 56, case 10: 0 bytes, and cut short: predict.py skips both
    (out / "model_fold2.pth").write_bytes((out / "model_fold0.pth").read_bytes()[:300])
    left_out: list[str] = []
    assert sorted(f.name for f in kaggle.served_files(out, left_out)) == sorted(names)
    assert left_out[0] == "output/model_fold1.pth: 0 bytes" and left_out[1].startswith("output/model_fold2.pth: ")
    assert len(left_out) == 2
    (out / "oof.csv").write_text("x")  # a text's F1 threshold is chosen on it: shipped under --metric f1 alone
    assert sorted(f.name for f in kaggle.served_files(out, [], "f1")) == sorted([*names, "oof.csv"])
    assert sorted(f.name for f in kaggle.served_files(out, [], "auc")) == sorted(names)

    # grown seeds that lost on the OOF rows (hand_in.json names them by their times, which do not
    # travel): predict.py leaves them out here, and the notebook's predict.py would not
    for name in ("test_lgbm_fold0_seed2.csv", "tree_lgbm_fold0_seed2.json", "tree_lgbm_fold0_seed2.txt"):
        (out / name).write_text("x")
    lost = [out / "model_fold0_seed2.pth", out / "test_lgbm_fold0_seed2.csv"]
    seeds = {p.name: p.stat().st_mtime_ns for p in lost}
    (out / "hand_in.json").write_text(json.dumps({"seeds": {lost[0].name: seeds[lost[0].name]}, "seeds_lgbm": seeds}))
    left_out = []
    assert sorted(f.name for f in kaggle.served_files(out, left_out)) == sorted(set(names) - {"model_fold0_seed2.pth"})
    why = "a grown seed that lost on the OOF rows (hand_in.json)"
    seeds_files = ("model_fold0_seed2.pth", "tree_lgbm_fold0_seed2.json", "tree_lgbm_fold0_seed2.txt")
    assert [w for w in left_out if why in w] == [f"output/{n}: {why}" for n in seeds_files], left_out
    assert len(left_out) == 5


def test_the_hand_in_verdicts_are_read_without_numpy_torch_or_pandas(tmp_path):
    """kagtpl's own install has none of them (pyproject's dependencies): kagtpl kaggle reads
    hand_in.json through the template's hand_in.py, which imports numpy only where it scores."""
    code = (
        "import sys\n"
        "for name in ('numpy', 'torch', 'pandas'): sys.modules[name] = None\n"
        "from kagtpl.template import template_module\n"
        "hand_in = template_module('hand_in')\n"
        f"print(hand_in.left_out({str(tmp_path)!r}), hand_in.standing_fallback({str(tmp_path)!r}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "set() None", r.stderr


def test_out_dir_ships_a_run_written_to_another_folder(project, tmp_path):
    """`python train.py --out-dir exp1` then `kagtpl kaggle --serve` said "none in output/ loads: run
    python train.py first", and no flag shipped exp1: --out-dir names the run to ship."""
    import torch

    run = tmp_path / "exp 1"  # beside the project, a space in its name
    run.mkdir()
    torch.save({"model": {"w": torch.zeros(4)}, "config": {}, "classes": ["a"]}, run / "model_fold0.pth")
    (run / "serve_defaults.json").write_text("{}")
    (run / "best_params.json").write_text('{"params": {"lr": 0.002}}')
    flags = ["--user", "alice", "--no-wheels", "--serve"]
    r = kagtpl("kaggle", str(project), *flags, cwd=tmp_path)
    assert r.returncode == 1 and "(a run written elsewhere: --out-dir DIR)" in r.stderr, r.stderr
    r = kagtpl("kaggle", str(project), *flags, "--out-dir", "exp 1", cwd=tmp_path)  # relative: to where it runs
    assert r.returncode == 0, r.stderr
    shipped = sorted(p.name for p in (project / "kaggle" / "weights").iterdir())
    assert shipped == ["dataset-metadata.json", "model_fold0.pth", "serve_defaults.json"]
    assert (project / "kaggle" / "code" / "best_params.json").read_text() == '{"params": {"lr": 0.002}}'


@pytest.mark.parametrize("args,spoil,message", ERRORS, ids=[m[:30] for _, _, m in ERRORS])
def test_bad_input_is_one_red_line_and_leaves_nothing(project, tmp_path, args, spoil, message):
    if spoil:
        spoil(project)
    user = [] if message.startswith("--user") else ["--user", "alice"]
    before = sorted(p.name for p in project.iterdir())
    r = kagtpl("kaggle", str(project), *user, *args, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert sorted(p.name for p in project.iterdir()) == before  # no kaggle/, no staging folder


def test_a_folder_that_is_not_a_project_is_refused(tmp_path):
    r = kagtpl("kaggle", str(tmp_path), "--user", "alice", cwd=tmp_path)
    assert r.returncode == 1 and "no .copier-answers.yml" in r.stderr and not (tmp_path / "kaggle").exists()


@pytest.mark.slow
def test_the_notebook_runs_offline_in_a_simulated_kaggle_tree(project, digits_dir, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    args = ["--user", "alice", "--no-wheels", "--budget", "2m", "--no-pretrained"]  # offline: from scratch
    (project / "output").mkdir()  # tune.py's result travels with the code; run.py on Kaggle reads it
    # signed as tune.py signs it, on the local copy of the data (the project's modules, as a script runs)
    code = "import train; from machinery import artifacts as a; x = train.get_args([])\n"
    code += "print(a.run_signature(x), a.params_signature(x))"
    signature, params_signature = run_script(project, "-c", code).stdout.split()
    best = {"params": {"lr": 0.002, "crop_scale": 0.5}, "trial": 7}
    best.update(signature=signature, params_signature=params_signature)
    (project / "output" / "best_params.json").write_text(json.dumps(best))
    r = kagtpl("kaggle", str(project), *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    root = tmp_path / "kaggle-root"
    # the newer mount point; the files, not their modification times (Kaggle's copy need not keep them)
    shutil.copytree(digits_dir, root / "input" / "competitions" / "digits-comp", copy_function=shutil.copy)
    shutil.copytree(project / "kaggle" / "code", root / "input" / "digits-proj-code")
    (root / "working").mkdir()
    for key, value in {**RUN_ENV, "KAGGLE_ROOT": str(root), "KAGGLE_KERNEL_RUN_TYPE": "Batch"}.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(project / "kaggle" / "notebook.ipynb", as_version=4)
    t0 = time.time()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    took = time.time() - t0
    printed = "\n".join(
        o.get("text", "") or json.dumps(o.get("data", {})) for cell in nb.cells for o in cell.get("outputs", [])
    )
    assert "run.py exited 0" in printed, printed[-3000:]
    assert "SUBMISSION: " in printed and "submission.csv: 40 rows" in printed
    sub = pd.read_csv(root / "working" / "submission.csv", dtype={"id": str})
    sample = pd.read_csv(digits_dir / "sample_submission.csv", dtype={"id": str})
    assert list(sub.columns) == list(sample.columns) and list(sub["id"]) == list(sample["id"])
    assert (sub.iloc[:, 1:].sum(axis=1) - 1).abs().max() < 1e-4
    run_log = (root / "working" / "run.log").read_text()
    # the notebook streams run.py's output as it comes (it once printed the last 30 lines at the end)
    assert run_log.splitlines()[0] in printed and "PARALLEL: " in printed and "FOLD 0 (" in printed
    assert f"RUN: train.py --params {root / 'working' / 'best_params.json'} (tune.py's trial 7" in run_log, run_log
    # ...and train.py trained with it (until 2026-12-03 the other file times left it out: PARAMS: ... left out)
    assert "left out" not in run_log, run_log
    import torch

    config = torch.load(root / "working" / "model_fold0.pth", weights_only=True)["config"]
    assert (config["params"], config["crop_scale"]) == (str(root / "working" / "best_params.json"), 0.5)
    print(f"notebook: {took:.0f}s\n{printed[-2500:]}")


def test_new_records_the_competition_slug_the_scripts_read_on_kaggle(tmp_path, digits_dir):
    r = kagtpl(
        "new",
        "dog-breed",
        "--task",
        "image",
        "--gpu",
        "t4",
        "--competition",
        "dog-breed-identification",
        "--data",
        str(digits_dir),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    project = tmp_path / "dog-breed"
    assert "competition: dog-breed-identification" in (project / ".copier-answers.yml").read_text()
    assert 'COMPETITION = "dog-breed-identification"' in (project / "train.py").read_text()
    bad = kagtpl("new", "p", "--task", "image", "--gpu", "t4", "--competition", "Dog_Breed", cwd=tmp_path)
    assert bad.returncode == 1 and "--competition 'Dog_Breed': a Kaggle slug" in bad.stderr


@pytest.mark.parametrize("mount", [("dog-breed-identification",), ("competitions", "dog-breed-identification")])
def test_the_data_is_found_where_kaggle_mounts_it(project_modules, tmp_path, monkeypatch, mount):
    hardware = project_modules.hardware
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    monkeypatch.setenv("KAGGLE_ROOT", str(tmp_path))
    data = tmp_path.joinpath("input", *mount)
    data.mkdir(parents=True)
    assert hardware.data_and_output_dirs("dog-breed-identification", "data") == (str(data), str(tmp_path / "working"))
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE")
    elsewhere = ("data", str(hardware.PROJECT / "output"))  # started from another folder: the project's output/
    assert hardware.data_and_output_dirs("dog-breed-identification", "data") == elsewhere
    monkeypatch.chdir(hardware.PROJECT)
    assert hardware.data_and_output_dirs("dog-breed-identification", "data") == ("data", "output")


KAGGLE_DRIVER = r"""
import json, os, re, signal, sys, threading, time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

notebook, cwd, result_file = sys.argv[1:4]
work = Path(os.environ["KAGGLE_ROOT"]) / "working"
nb = nbformat.read(notebook, as_version=4)
client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": cwd}})
result = {"network": [line.split()[0] for line in open("/proc/net/dev").read().splitlines()[2:]]}
result["cpus"] = len(os.sched_getaffinity(0))


def execute():
    try:
        client.execute()
    except Exception as e:  # the kernel was stopped: DeadKernelError, or a cell's error
        result["notebook"] = type(e).__name__


thread = threading.Thread(target=execute, daemon=True)
thread.start()
t_end = time.time() + 300
while time.time() < t_end:  # the stop comes mid-training: fold 0's second epoch or a later one
    log = (work / "run.log").read_text() if (work / "run.log").is_file() else ""
    if re.search(r"^Epoch (?:[2-9]|[1-9][0-9]+): ", log, re.M):  # an epoch under 1 s may hold its line back
        break
    time.sleep(0.2)
kernel = client.km.provisioner.process.pid
result["stopped_at"] = time.time()
os.killpg(os.getpgid(kernel), signal.SIGTERM)  # the container's stop: the kernel's whole process group
thread.join(60)


def in_work():
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/cwd") == str(work):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            continue
    return found


t_end = time.time() + 180
while in_work() and time.time() < t_end:
    time.sleep(0.5)
result["left_running"] = in_work()
Path(result_file).write_text(json.dumps(result))
"""


@pytest.mark.slow
def test_a_kaggle_shaped_run_stopped_mid_training_hands_in_the_trained_folds(tmp_path, digits_dir):
    """Issue 56: the notebook `kagtpl kaggle` writes, run the way Kaggle runs it. A project made
    without --competition, packaged with --competition digits-comp (case 11: the packaged code
    read /kaggle/input/<project name>). A real Jupyter kernel (nbclient) executes it cell by cell
    with the data read-only under a /kaggle/input-shaped folder (a read-only bind mount: root
    writes past a folder's mode), output under a /kaggle/working-shaped one, no network (a network
    namespace with loopback alone), at most 4 CPUs and a memory cap (a cgroup); then a container
    stop, SIGTERM to the kernel's whole process group, in the middle of fold 0. The trained fold is
    handed in and nothing is left running."""
    if subprocess.run(["unshare", "-m", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount and network namespaces here (unshare -m -n)")
    project = render(tmp_path / "digits-proj", data_dir=str(digits_dir), folds=3, epochs=30)
    assert 'COMPETITION = "digits-proj"' in (project / "train.py").read_text()
    args = ["--user", "alice", "--no-wheels", "--budget", "2m", "--no-pretrained", "--competition", "digits-comp"]
    r = kagtpl("kaggle", str(project), *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    root = tmp_path / "kaggle-root"
    shutil.copytree(digits_dir, root / "input" / "competitions" / "digits-comp")
    shutil.copytree(project / "kaggle" / "code", root / "input" / "digits-proj-code")
    (root / "working").mkdir()
    cgroup = Path(f"/sys/fs/cgroup/memory/kagtpl-test-{os.getpid()}")
    cap = 6 * 2**30  # Kaggle's 30 GB RAM for 4 CPUs; this run needs ~2 GB
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(cap))
        cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:4])
        driver = tmp_path / "driver.py"
        driver.write_text(KAGGLE_DRIVER)
        result_file = tmp_path / "result.json"
        inner = (
            f'mount --bind -o ro "{root / "input"}" "{root / "input"}" && ip link set lo up && '
            f'exec taskset -c {cpus} "{sys.executable}" "{driver}" "{project / "kaggle" / "notebook.ipynb"}" '
            f'"{tmp_path}" "{result_file}"'
        )
        env = {**RUN_ENV, "KAGGLE_ROOT": str(root), "KAGGLE_KERNEL_RUN_TYPE": "Batch"}
        shell = f"echo $$ > \"{cgroup / 'cgroup.procs'}\" && exec unshare -m -n sh -c '{inner}'"
        r = subprocess.run(["sh", "-c", shell], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        result = json.loads(result_file.read_text())
        peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
    finally:
        subprocess.run(["sh", "-c", f'cat "{cgroup / "cgroup.procs"}" | xargs -r kill -9'], check=False)
        time.sleep(0.5)
        cgroup.rmdir()
    assert result["network"] == ["lo:"] and result["cpus"] <= 4 and peak < cap, result
    assert result["left_running"] == [], result
    work = root / "working"
    train_log = (work / "train.log").read_text()
    assert re.search(r"^STOPPED: SIGTERM; exiting 0 so predict.py runs", train_log, re.M), train_log[-3000:]
    assert "FOLD 1 (" not in train_log  # stopped in fold 0
    sub = pd.read_csv(work / "submission.csv", dtype={"id": str})
    sample = pd.read_csv(digits_dir / "sample_submission.csv", dtype={"id": str})
    assert list(sub.columns) == list(sample.columns) and list(sub["id"]) == list(sample["id"])
    probs = sub.iloc[:, 1:].to_numpy()
    assert not (probs == probs[0]).all(), "the fallback (the class prior for every row) was handed in"
    assert (work / "submission.csv").stat().st_mtime > result["stopped_at"]  # made after the stop, by predict.py
    assert list((root / "input" / "competitions" / "digits-comp").iterdir())  # read from where the metadata said
    print(f"memory peak {peak / 2**30:.2f} GB of a {cap / 2**30:.0f} GB cap; CPUs {result['cpus']}")
