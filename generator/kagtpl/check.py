"""`kagtpl check`: is a newer template version than the project's available?"""

from __future__ import annotations

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
    """(the project's version, a newer available version or None)."""
    answers = read_answers(path.resolve())
    if bad := unresolved(path.resolve()):
        raise KagtplError(
            f"unresolved update conflicts in {', '.join(bad)}: resolve the <<<<<<< / >>>>>>> blocks (and *.rej) first"
        )
    src = template_source(answers)
    current = str(answers.get("_commit"))
    available = sorted(tags(src), key=version_key)
    newest = available[-1] if available else None
    if newest is None or version_key(newest) <= version_key(current.split("-")[0]):
        return current, None
    return current, newest
