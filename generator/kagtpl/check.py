"""`kagtpl check`: is a newer template version than the project's available?"""

from __future__ import annotations

from pathlib import Path

from kagtpl.template import tags
from kagtpl.update import read_answers, template_source, version_key


def check_project(path: Path) -> tuple[str, str | None]:
    """(the project's version, a newer available version or None)."""
    answers = read_answers(path.resolve())
    src = template_source(answers)
    current = str(answers.get("_commit"))
    available = sorted(tags(src), key=version_key)
    newest = available[-1] if available else None
    if newest is None or version_key(newest) <= version_key(current.split("-")[0]):
        return current, None
    return current, newest
