"""Updating existing projects with real template versions: a temporary git repository of the
kagtpl source tagged v1 and v2, wheels built from it and installed, `kagtpl new`, user edits,
then `kagtpl update` and plain `copier update`. All offline.

Across the engine change: tests/data/kagtpl-0.1.0-source.tar.gz is the source of kagtpl 0.1.0,
the last release whose train.py held the fold loop itself (kit.py beside it); a project rendered
from it is updated to this checkout's template."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, RUN_ENV

pytestmark = [pytest.mark.slow, pytest.mark.onecore]  # Copier, git, build, pip: one process at a time

GIT_ID = ["-c", "user.name=kagtpl test", "-c", "user.email=test@kagtpl.invalid", "-c", "commit.gpgsign=false"]
# the v2 template change: a new machinery line in gpu.py and a changed line in train.py
KIT_ANCHOR = "GB = 1024**3\n"
KIT_V2 = "GB = 1024**3\nTEMPLATE_FEATURE_V2 = True  # added in the v2 template\n"
TRAIN_OLD = 'help="384 px needs ~2x the memory of 224")'  # --image-size's help, away from the user's edit
TRAIN_V2 = 'help="384 px needs ~2x the memory of 224 px")'
SCHEDULE_OLD = "engine.add_schedule_flags(p, EPOCHS, patience=3,"  # the user's edit: a schedule default
SCHEDULE_EDIT = SCHEDULE_OLD.replace("patience=3", "patience=7")


def git(cwd, *args):
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def kagtpl(env, cwd, *args, check=True):
    r = subprocess.run(
        [sys.executable, "-m", "kagtpl", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    if check and r.returncode != 0:
        raise AssertionError(f"kagtpl {args} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


class Release:
    """A copy of the kagtpl source in its own git repository, released as tagged versions."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        git(root, "init", "-q", "-b", "main")
        self.copy_checkout()

    def copy_checkout(self) -> None:
        """Make the source tree this checkout's (files the checkout lacks are removed)."""
        for path in self.root.iterdir():
            if path.name != ".git":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        root = self.root
        files = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        for name in files:
            if (ROOT / name).is_file():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, root / name)

    @classmethod
    def from_archive(cls, root: Path, archive: Path) -> Release:
        """An earlier release's source, from a tar.gz of its tree."""
        release = cls.__new__(cls)
        release.root = root
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
        git(root, "init", "-q", "-b", "main")
        return release

    def release(self, version: str, dist: Path) -> Path:
        init = self.root / "generator" / "kagtpl" / "__init__.py"
        text = init.read_text()
        init.write_text(text[: text.index("__version__")] + f'__version__ = "{version}"\n')
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "-m", f"release {version}")
        git(self.root, "tag", f"v{version}")
        tmp = dist / f"tmp-{version}"  # an old release's build hook left its bundle's folder in TMPDIR
        tmp.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(self.root)],
            check=True,
            capture_output=True,
            timeout=300,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        return next(dist.glob(f"kagtpl-{version}-*.whl"))

    def edit(self, path: str, old: str, new: str) -> None:
        file = self.root / path
        text = file.read_text()
        assert old in text
        file.write_text(text.replace(old, new, 1))


def install(wheel: Path, site: Path) -> None:
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )


IMAGE_TRAIN = "template/{% if task == 'image' %}train.py{% endif %}.jinja"


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Wheels of v1.0.0 and v2.0.0 (whose template changed), built from real tagged commits."""
    base = tmp_path_factory.mktemp("release")
    repo = Release(base / "src")
    v1 = repo.release("1.0.0", base / "dist1")
    repo.edit("template/machinery/gpu.py", KIT_ANCHOR, KIT_V2)
    repo.edit(IMAGE_TRAIN, TRAIN_OLD, TRAIN_V2)
    v2 = repo.release("2.0.0", base / "dist2")
    return v1, v2


@pytest.fixture()
def env(tmp_path):
    site = tmp_path / "site"
    return site, {**os.environ, "PYTHONPATH": str(site), "KAGTPL_HOME": str(tmp_path / "kagtpl-home")}


def new_project(tmp_path, env, wheel):
    site, environ = env
    install(wheel, site)
    kagtpl(environ, tmp_path, "new", "comp", "--task", "image", "--gpu", "t4")
    project = tmp_path / "comp"
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "kagtpl new")
    return project


def test_new_from_wheel_then_update_keeps_user_edits(tmp_path, env, releases):
    v1, v2 = releases
    site, environ = env
    project = new_project(tmp_path, env, v1)
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_commit"] == "v1.0.0"
    assert answers["_src_path"] == str(tmp_path / "kagtpl-home" / "template.bundle")  # absolute and stable

    # the user's edits, away from what v2 changes: a train.py default and a new file
    train = (project / "train.py").read_text()
    assert SCHEDULE_OLD in train
    (project / "train.py").write_text(train.replace(SCHEDULE_OLD, SCHEDULE_EDIT))
    (project / "features.py").write_text("EXTRA = 1\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "my edits")

    install(v2, site)  # pip install -U kagtpl
    assert "Template v2.0.0 is available (project is on v1.0.0)" in kagtpl(environ, project, "check").stdout
    r = kagtpl(environ, project, "update")
    assert "Updated" in r.stdout and "from template v1.0.0 to v2.0.0" in r.stdout and "No conflicts" in r.stdout
    train = (project / "train.py").read_text()
    assert SCHEDULE_EDIT in train  # the user's edit
    assert TRAIN_V2 in train  # the template's change
    assert "TEMPLATE_FEATURE_V2 = True" in (project / "machinery" / "gpu.py").read_text()
    assert (project / "features.py").read_text() == "EXTRA = 1\n"
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == "v2.0.0"
    assert "Up to date: the project is on template v2.0.0" in kagtpl(environ, project, "check").stdout


def test_conflict_exits_nonzero_and_names_the_file(tmp_path, env, releases):
    v1, v2 = releases
    site, environ = env
    project = new_project(tmp_path, env, v1)
    train = (project / "train.py").read_text()
    (project / "train.py").write_text(train.replace(TRAIN_OLD, 'help="my size")'))
    git(project, "commit", "-q", "-am", "my help")
    install(v2, site)
    r = kagtpl(environ, project, "update", check=False)
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the update left conflicts in train.py") and "git reset --hard" in line
    assert "<<<<<<< " in (project / "train.py").read_text()


def test_dirty_tree_or_no_repo_is_refused_and_nothing_changes(tmp_path, env, releases):
    v1, v2 = releases
    site, environ = env
    project = new_project(tmp_path, env, v1)
    (project / "train.py").write_text((project / "train.py").read_text() + "# unsaved work\n")
    install(v2, site)
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file() and ".git" not in p.parts}
    r = kagtpl(environ, project, "update", check=False)
    assert r.returncode == 1 and "has uncommitted changes: commit or stash them" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file() and ".git" not in p.parts} == before

    shutil.rmtree(project / ".git")
    r = kagtpl(environ, project, "update", check=False)
    assert r.returncode == 1 and "is not a git repository: run `git init" in r.stderr


def test_changed_answer_rerenders_the_derived_values(tmp_path, env, releases):
    v1, v2 = releases
    site, environ = env
    project = new_project(tmp_path, env, v1)
    # on the same template with the same answers nothing changes, and the command says so (not "Updated")
    r = kagtpl(environ, project, "update", "--to", "1.0.0", "--data", "gpu=t4")
    said = f"Nothing to update: {project} is on template v1.0.0 already, with the same answers"
    assert r.stdout.splitlines() == [said]
    assert not git(project, "status", "--porcelain")
    r = kagtpl(environ, project, "update", "--to", "1.0.0", "--data", "gpu=a100-80")
    assert f"Updated {project}: its changed answers rendered again on template v1.0.0" in r.stdout
    assert "No conflicts" in r.stdout
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["gpu"] == "a100-80"
    assert 'GPU_PROFILE = "a100-80"' in (project / "train.py").read_text()
    # the batch and workers are derived from GPU_PROFILE by the project's own rules
    probe = (
        "import train; from machinery import hardware; p = hardware.PROFILES[train.GPU_PROFILE]; "
        "r = hardware.recommend(p, train.MODEL, train.IMAGE_SIZE); print(r.batch_size, r.loader['num_workers'])"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=project, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["416", "11"]  # t4 was 64 and 3


def test_plain_copier_update_works_too(tmp_path, env, releases):
    v1, v2 = releases
    site, environ = env
    project = new_project(tmp_path, env, v1)
    install(v2, site)
    kagtpl(environ, project, "check")  # any kagtpl command refreshes the stable template bundle
    r = subprocess.run(
        [sys.executable, "-m", "copier", "update", "--defaults", "--skip-answered"],
        cwd=project,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "TEMPLATE_FEATURE_V2 = True" in (project / "machinery" / "gpu.py").read_text()
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == "v2.0.0"


# ----------------------------------------------------------------------------- across the engine change

PRE_ENGINE = ROOT / "tests" / "data" / "kagtpl-0.1.0-source.tar.gz"
USER_EDIT = ("A.ColorJitter(brightness=0.2", "A.ColorJitter(brightness=0.3")  # a transform: it did not move
MOVED_EDIT = (  # the early-stopping line: 0.1.0 kept it in train.py, the engine owns it now
    'print(f"EARLY STOP: fold {fold} epoch {epoch}, no better val loss for {cfg.patience} epochs")',
    'print(f"EARLY STOP (mine): fold {fold} epoch {epoch}")',
)


def old_and_checkout(tmp_path_factory, name: str, archive: Path, old: str, new: str):
    """Wheels of an archived release (tagged `old`) and of this checkout (tagged `new`)."""
    base = tmp_path_factory.mktemp(name)
    repo = Release.from_archive(base / "src", archive)
    wheel = repo.release(old, base / "dist1")
    repo.copy_checkout()
    return wheel, repo.release(new, base / "dist2")


@pytest.fixture(scope="module")
def engine_releases(tmp_path_factory):
    """Wheels of 0.1.0 (train.py + kit.py) and 0.2.0 (this checkout: train.py + engine.py ...)."""
    return old_and_checkout(tmp_path_factory, "engine-release", PRE_ENGINE, "0.1.0", "0.2.0")


def assert_project_tests_pass(project: Path) -> None:
    """The updated project works: its own tests (model, loss, metric, checkpoints) pass."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        env={**RUN_ENV, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def edit_and_commit(project: Path, old: str, new: str) -> None:
    text = (project / "train.py").read_text()
    assert old in text
    (project / "train.py").write_text(text.replace(old, new, 1))
    git(project, "commit", "-q", "-am", "my edit")


def test_update_across_the_engine_change_keeps_an_edit_that_did_not_move(tmp_path, env, engine_releases):
    old, new = engine_releases
    site, environ = env
    project = new_project(tmp_path, env, old)
    assert (project / "kit.py").exists() and not (project / "engine.py").exists()
    edit_and_commit(project, *USER_EDIT)
    install(new, site)
    r = kagtpl(environ, project, "update")
    assert "from template v0.1.0 to v0.2.0" in r.stdout and "No conflicts" in r.stdout
    train = (project / "train.py").read_text()
    assert USER_EDIT[1] in train  # the user's edit survived...
    assert "run.cross_validate(" in train and "def train_fold" not in train  # ...in the new layout
    assert not (project / "kit.py").exists()  # the old machinery is gone, the new is there
    assert {"engine.py", "planner.py", "storage.py", "images.py"} <= {p.name for p in (project / "machinery").iterdir()}
    # the updated project works: its own tests (model, loss, metric, checkpoints) pass
    assert_project_tests_pass(project)


def test_update_across_the_engine_change_reports_an_edit_of_moved_code(tmp_path, env, engine_releases):
    old, new = engine_releases
    site, environ = env
    project = new_project(tmp_path, env, old)
    edit_and_commit(project, *MOVED_EDIT)
    install(new, site)
    r = kagtpl(environ, project, "update", check=False)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("error: the update left conflicts in train.py")
    assert "<<<<<<< " in (project / "train.py").read_text()


# ----------------------------------------------------------------------------- across the move to machinery/ (0.6.0)

FLAT = ROOT / "tests" / "data" / "kagtpl-0.5.0-source.tar.gz"  # the last release with the engine beside train.py
ENGINE_EDIT = ('print(f"EARLY STOP: fold {k}', 'print(f"EARLY STOP (mine): fold {k}')  # a machinery edit


@pytest.fixture(scope="module")
def layout_releases(tmp_path_factory):
    """Wheels of 0.5.0 (train.py beside engine.py, gpu.py ...) and 0.6.0 (this checkout: machinery/)."""
    return old_and_checkout(tmp_path_factory, "layout-release", FLAT, "0.5.0", "0.6.0")


def test_update_from_0_5_0_moves_the_engine_into_machinery(tmp_path, env, layout_releases):
    """A 0.5.0 project with an edit in train.py and one in engine.py: the update moves the
    engine into machinery/, merges the train.py edit, reports the engine.py edit as a conflict
    (exit 1), and the moved project's own tests pass once that is resolved."""
    old, new = layout_releases
    site, environ = env
    project = new_project(tmp_path, env, old)
    assert (project / "engine.py").is_file() and not (project / "machinery").exists()
    for path, (before, after) in (("train.py", USER_EDIT), ("engine.py", ENGINE_EDIT)):
        text = (project / path).read_text()
        assert before in text
        (project / path).write_text(text.replace(before, after, 1))
    git(project, "commit", "-q", "-am", "my edits")
    install(new, site)
    r = kagtpl(environ, project, "update", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "engine.py" in r.stderr.strip().splitlines()[-1]  # the machinery edit: reported, not lost
    assert USER_EDIT[1] in (project / "train.py").read_text()  # the competition edit merged
    top = {p.name for p in project.iterdir()}
    assert {"machinery", "train.py", "predict.py", "run.py", "tune.py"} <= top
    assert not {"gpu.py", "planner.py", "storage.py", "images.py"} & top  # the flat engine is gone
    assert (project / "machinery" / "engine.py").is_file() and (project / "machinery" / "fold.py").is_file()
    # resolve as the update's message says (drop the old engine.py edit), then the project's own tests
    for leftover in [*project.glob("*.rej"), project / "engine.py"]:
        leftover.unlink(missing_ok=True)
    assert_project_tests_pass(project)


def test_check_and_update_compare_a_checkouts_commits_when_it_has_no_release_tags(tmp_path):
    """A source checkout with no version tags (this repository has none): `kagtpl check` said "Up
    to date" after any template commit, and `update --to 0.5.0` answered "available: none". Now
    check compares the project's template commit with the checkout's HEAD, and update says how
    to take it."""
    repo = Release(tmp_path / "src")
    git(repo.root, "add", "-A")
    git(repo.root, "commit", "-q", "-m", "a checkout")
    environ = {**os.environ, "PYTHONPATH": str(repo.root / "generator"), "KAGTPL_HOME": str(tmp_path / "home")}
    kagtpl(environ, tmp_path, "new", "comp", "--task", "image", "--gpu", "t4")
    project = tmp_path / "comp"
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "kagtpl new")
    assert kagtpl(environ, project, "check").stdout.startswith("Up to date: the project is on template ")

    repo.edit("template/machinery/gpu.py", KIT_ANCHOR, KIT_V2)  # a template commit after the project's
    git(repo.root, "commit", "-q", "-am", "a template change")
    said = kagtpl(environ, project, "check").stdout
    assert said.startswith("Template HEAD (") and "1 commit newer) is available" in said, said
    assert said.rstrip().endswith("run kagtpl update --to HEAD ."), said

    r = kagtpl(environ, project, "update", "--to", "0.5.0", check=False)
    assert r.returncode == 1 and "has no release tags (a source checkout); --to HEAD takes its newest" in r.stderr
    kagtpl(environ, project, "update", "--to", "HEAD")
    assert "TEMPLATE_FEATURE_V2 = True" in (project / "machinery" / "gpu.py").read_text()
    git(project, "commit", "-q", "-am", "kagtpl update")
    assert kagtpl(environ, project, "check").stdout.startswith("Up to date")
