"""`kagtpl update` and `kagtpl check`: bring a project to a newer template, keeping the user's
edits, and say loudly when a merge left conflicts (plain `copier update` exits 0 even then)."""

from __future__ import annotations

import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kagtpl import __version__
from kagtpl.errors import KagtplError
from kagtpl.template import refresh_stable_bundle, stable_bundle_path, tags, version_tag

ANSWERS = ".copier-answers.yml"
MARKERS = ("<<<<<<< ", ">>>>>>> ")


@dataclass
class UpdateRequest:
    path: Path
    to: str | None = None  # a version (0.2.0 or v0.2.0), HEAD, or None for the installed kagtpl's
    data: dict[str, str] = field(default_factory=dict)


def parse_data(items: list[str]) -> dict[str, str]:
    data = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise KagtplError(f"--data {item!r}: use key=value, e.g. --data gpu=a100-80")
        data[key.strip()] = value.strip()
    return data


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout


def read_answers(path: Path) -> dict:
    answers_file = path / ANSWERS
    if not answers_file.is_file():
        raise KagtplError(f"{path}: no {ANSWERS}; is this a project made by kagtpl new?")
    answers = yaml.safe_load(answers_file.read_text()) or {}
    if not answers.get("_src_path"):
        raise KagtplError(f"{answers_file}: no _src_path; cannot tell which template it came from")
    return answers


def changed(path: Path) -> bool:
    """Whether the project has uncommitted changes (its git status is not clean): refused before
    an update, and after one, whether it changed any file."""
    return bool(git(path, "status", "--porcelain", "--untracked-files=normal").strip())


def check_clean_repo(path: Path) -> None:
    try:
        top = git(path, "rev-parse", "--show-toplevel").strip()
    except (OSError, subprocess.CalledProcessError):
        raise KagtplError(
            f"{path} is not a git repository: run `git init && git add -A && git commit -m start` there first, "
            "so an update can be merged and undone"
        ) from None
    if changed(path):
        raise KagtplError(f"{top} has uncommitted changes: commit or stash them (git stash), then run kagtpl update")


def template_source(answers: dict) -> str:
    """The recorded _src_path; the stable bundle is refreshed from this kagtpl first."""
    src = str(answers["_src_path"])
    if src == str(stable_bundle_path()):
        refresh_stable_bundle()  # after `pip install -U kagtpl` the stable copy gains the new tags
    if not Path(src).exists():
        raise KagtplError(f"template source {src} (the project's _src_path) is missing; reinstall kagtpl")
    if not answers.get("_commit"):
        raise KagtplError(
            f"{ANSWERS} records no _commit: the project was rendered from a plain folder, not a "
            "versioned template, and cannot be updated"
        )
    return src


def target_ref(src: str, to: str | None) -> str | None:
    available = tags(src)
    if to is not None:
        ref = version_tag(to)
        if ref != "HEAD" and ref not in available:
            if not available:
                raise KagtplError(
                    f"template version {ref} not found: {src} has no release tags (a source checkout); "
                    "--to HEAD takes its newest commit (git pull there first for a newer one)"
                )
            raise KagtplError(f"template version {ref} not found; available: {', '.join(available)}")
        return ref
    mine = version_tag(__version__)
    if not available:
        return "HEAD"  # a checkout without release tags: its newest commit
    return mine if mine in available else None  # None: Copier takes the latest tag


def conflicts(path: Path) -> list[str]:
    """Files an update left with conflict markers, unmerged paths, and *.rej files."""
    changed = git(path, "status", "--porcelain", "--untracked-files=all").splitlines()
    found = []
    for line in changed:
        status, name = line[:2], line[3:].strip().strip('"')
        file = path / name
        if "U" in status or name.endswith(".rej"):
            found.append(name)
        elif file.is_file():
            text = file.read_text(errors="replace")
            if any(line.startswith(MARKERS) for line in text.splitlines()):
                found.append(name)
    return sorted(set(found))


def update_project(req: UpdateRequest) -> tuple[str, str, list[str]]:
    """Run the update; returns (old version, new version, files with conflicts)."""
    import copier
    from copier.errors import CopierError, DirtyLocalWarning

    path = req.path.resolve()
    answers = read_answers(path)
    check_clean_repo(path)
    src = template_source(answers)
    ref = target_ref(src, req.to)
    old = str(answers.get("_commit"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DirtyLocalWarning)
            edited = edited_files(path, answers, src)
            copier.run_update(path, data=req.data, defaults=True, overwrite=True, vcs_ref=ref, quiet=True, unsafe=False)
    except (CopierError, ValueError, subprocess.CalledProcessError) as e:
        raise KagtplError(f"copier update failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    new = str(read_answers(path).get("_commit"))
    return old, new, conflicts(path) + restore_removed(path, edited)


def outcome_line(path: Path, old: str, new: str, did_change: bool) -> str:
    """What the update did, said truthfully: a project already on the newest template, whose answers
    did not change either, is left as it was (`kagtpl update` used to say "Updated ... from X to X")."""
    if not did_change:
        return f"Nothing to update: {path} is on template {new} already, with the same answers"
    if old == new:
        return f"Updated {path}: its changed answers rendered again on template {new} (the template did not change)"
    return f"Updated {path} from template {old} to {new}"


def edited_files(path: Path, answers: dict, src: str) -> dict[str, bytes]:
    """The project's files that its template version rendered and the user has edited since:
    {relative path: the user's content}. Copier deletes a file the new template no longer has
    (0.6.0 moved the engine into machinery/) even when the user edited it; this keeps the edit."""
    import tempfile

    import copier

    data = {k: v for k, v in answers.items() if not k.startswith("_")}
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "fresh"
        copier.run_copy(src, fresh, data=data, vcs_ref=answers["_commit"], defaults=True, quiet=True, unsafe=False)
        found = {}
        for file in fresh.rglob("*"):
            rel = file.relative_to(fresh)
            mine = path / rel
            if file.is_file() and rel.name != ANSWERS and mine.is_file():
                content = mine.read_bytes()
                if content != file.read_bytes():
                    found[str(rel)] = content
    return found


def restore_removed(path: Path, edited: dict[str, bytes]) -> list[str]:
    """Edited files the update deleted, written back as they were: each is a conflict to resolve
    by hand (port the edit to the file's new home, then delete it)."""
    restored = []
    for rel, content in sorted(edited.items()):
        file = path / rel
        if file.exists():
            continue
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(content)
        home = f"machinery/{Path(rel).name}"
        if (path / home).is_file():
            restored.append(
                f"{rel} (your edit of a file the template moved to {home}: port it there, then delete {rel})"
            )
        else:
            restored.append(
                f"{rel} (your edit of a file the template no longer has: keep what you need, then delete {rel})"
            )
    return restored


def version_key(tag: str) -> tuple:
    parts = tag.lstrip("v").split(".")
    return tuple(int(p) if p.isdigit() else 0 for p in parts)
