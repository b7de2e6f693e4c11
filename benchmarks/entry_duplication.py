"""How much of each task's entry scripts stands word for word in another task's (issue 58).

    python benchmarks/entry_duplication.py            # all six tasks rendered; one line per script

The template's entry scripts are Jinja-named files (`{% if task == 'image' %}train.py{% endif %}.jinja`),
which `duplicates` skips: copy-paste between tasks was invisible to the project's own checks. This
renders every task with Copier's run_copy and counts, for train.py and predict.py, the lines of each
task's script that stand in another task's same script: stripped, comments left out, 25 characters
or more (shorter lines, `return out` and the like, say nothing about copying). The goal: at most 10%.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import render  # noqa: E402  (Copier's run_copy of this checkout, as the tests render)

TASKS = {  # each task's answers beyond the defaults: a problem for the two that need one
    "image": {},
    "tabular": {"problem": "binary"},
    "text": {"problem": "binary"},
    "segmentation": {},
    "detection": {},
    "audio": {},
}
SCRIPTS = ("train.py", "predict.py")
MIN_CHARS = 25


def code_lines(path: Path) -> list[str]:
    """The script's lines as the measure reads them: stripped, no comment, MIN_CHARS or more."""
    lines = []
    for line in path.read_text().splitlines():
        text = line.split("  #")[0].strip()
        if len(text) >= MIN_CHARS and not text.startswith("#"):
            lines.append(text)
    return lines


def shared(projects: dict[str, Path], script: str) -> tuple[int, int, dict[str, float]]:
    """(lines standing in another task's `script`, all lines, each task's share)."""
    lines = {task: code_lines(path / script) for task, path in projects.items() if (path / script).is_file()}
    total = same = 0
    per_task = {}
    for task, mine in lines.items():
        others = set().union(*(set(v) for t, v in lines.items() if t != task))
        copied = sum(line in others for line in mine)
        total, same = total + len(mine), same + copied
        per_task[task] = copied / max(len(mine), 1)
    return same, total, per_task


def measure(work: Path) -> dict[str, tuple[int, int, dict[str, float]]]:
    projects = {task: render(work / task, task=task, **answers) for task, answers in TASKS.items()}
    return {script: shared(projects, script) for script in SCRIPTS}


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    with tempfile.TemporaryDirectory(prefix="kagtpl-dup-") as tmp:
        for script, (same, total, per_task) in measure(Path(tmp)).items():
            tasks = ", ".join(f"{t} {share:.0%}" for t, share in per_task.items())
            share = same / max(total, 1)
            print(f"{script}: {same} of {total} lines ({share:.1%}) stand in another task's {script} ({tasks})")


if __name__ == "__main__":
    main()
