"""`kagtpl check`: is a newer template version than the project's available?"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kagtpl.errors import KagtplError
from kagtpl.template import tags
from kagtpl.update import MARKERS, read_answers, template_source, version_key

SKIP = {".git", "output", ".venv", "__pycache__", "kaggle"}


def unresolved(path: Path) -> list[str]:
    """Project files (outputs and .git aside) with conflict markers or a *.rej beside them."""
    found = []
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path)
        if SKIP & set(rel.parts) or not file.is_file() or file.stat().st_size > 5_000_000:
            continue
        if file.suffix == ".rej" or any(
            line.startswith(MARKERS) for line in file.read_text(errors="replace").splitlines()
        ):
            found.append(str(rel))
    return found


def check_project(path: Path) -> tuple[str, str | None]:
    """(the project's version, a newer available version or None). Release tags first (a wheel's
    bundle holds every release); a source with no tag newer than the project's (a checkout of
    kagtpl: developing, or `git pull`ed) is compared by commit instead, so a template commit after
    the project's is never "Up to date"."""
    answers = read_answers(path.resolve())
    if bad := unresolved(path.resolve()):
        raise KagtplError(
            f"unresolved update conflicts in {', '.join(bad)}: resolve the <<<<<<< / >>>>>>> blocks (and *.rej) first"
        )
    src = template_source(answers)
    current = str(answers.get("_commit"))
    available = sorted(tags(src), key=version_key)
    newest = available[-1] if available else None
    if newest is not None and version_key(newest) > version_key(current.split("-")[0]):
        return current, newest
    return current, newer_commit(src, current)


def newer_commit(src: str, current: str) -> str | None:
    """A source checkout's HEAD when it is newer than the project's template commit: "HEAD
    (abc1234, 3 commits newer)"; None when they are the same commit, or for a bundle (releases
    only). A commit the checkout does not hold (a project rendered from uncommitted changes, or
    from another clone) is an error that says so: an update could not compute the user's edits."""
    if not Path(src, ".git").exists():
        return None
    head = _git(src, "rev-parse", "HEAD")
    mine = _git(src, "rev-parse", "--verify", "--quiet", current.split("-g")[-1] + "^{commit}")
    if head is None:
        return None
    if mine is None:
        raise KagtplError(
            f"the project's template commit {current} is not in {src} (rendered from uncommitted changes, or "
            f"another clone): check and update cannot compare it; render a new project, or fetch that commit there"
        )
    if mine == head:
        return None
    ahead = _git(src, "rev-list", "--count", f"{mine}..{head}") or "?"
    return f"HEAD ({head[:7]}, {ahead} commit{'s' if ahead != '1' else ''} newer)"


def _git(src: str, *args: str) -> str | None:
    r = subprocess.run(["git", "-C", src, *args], capture_output=True, text=True)
    return r.stdout.strip() or None if r.returncode == 0 else None
