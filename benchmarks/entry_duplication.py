"""How much of each task's entry scripts stands word for word in another task's (issue 58).

    python benchmarks/entry_duplication.py            # all six tasks rendered; one line per script
    python benchmarks/entry_duplication.py --kinds    # ...and what the shared lines are, by kind
    python benchmarks/entry_duplication.py --lines    # ...and each shared line, with the tasks that hold it

The template's entry scripts are Jinja-named files (`{% if task == 'image' %}train.py{% endif %}.jinja`),
which `duplicates` skips: copy-paste between tasks was invisible to the project's own checks. This
renders every task with Copier's run_copy and counts, for train.py and predict.py, the lines of each
task's script that stand in another task's same script: stripped, comments left out, 25 characters
or more (shorter lines, `return out` and the like, say nothing about copying). The goal: at most 10%.
"""

from __future__ import annotations

import argparse
import ast
import collections
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


def script_lines(projects: dict[str, Path], script: str) -> dict[str, list[str]]:
    """Each task's `script` as the measure reads it (code_lines), read once for both counts."""
    return {task: code_lines(path / script) for task, path in projects.items() if (path / script).is_file()}


def shared(lines: dict[str, list[str]]) -> tuple[int, int, dict[str, float]]:
    """(lines standing in another task's script, all lines, each task's share)."""
    total = same = 0
    per_task = {}
    for task, mine in lines.items():
        others = set().union(*(set(v) for t, v in lines.items() if t != task))
        copied = sum(line in others for line in mine)
        total, same = total + len(mine), same + copied
        per_task[task] = copied / max(len(mine), 1)
    return same, total, per_task


def docstring_lines(path: Path) -> set[str]:
    """Every line of the script's docstrings (module, classes, functions), stripped."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node, clean=False):
            found.update(line.strip().strip('"') for line in ast.get_docstring(node, clean=False).splitlines())
    return found


def kind(line: str, docs: set[str], tasks: set[str]) -> str:
    """What a shared line is: the interface, the run commands, a machinery call, or competition code."""
    if line.strip('"') in docs or line.startswith('"""'):
        return "docstrings: the run commands and their prose"
    if line.startswith(("import ", "from ")):
        return "imports"
    if line.startswith(("def ", "class ", "if __name__", "return engine.parse", "return prediction.parse")):
        return "signatures every task implements"
    if len(tasks) >= 4:
        return "other lines in 4 or more tasks (calls of the shared machinery)"
    return "competition code of " + ", ".join(sorted(tasks))


def tasks_holding(lines: dict[str, list[str]]) -> dict[str, set[str]]:
    """Each line read, and the tasks whose script holds it."""
    where = collections.defaultdict(set)
    for task, mine in lines.items():
        for line in mine:
            where[line].add(task)
    return where


def kinds(lines: dict[str, list[str]], projects: dict[str, Path], script: str) -> collections.Counter:
    """The shared lines of `script` by kind, each counted once in every task's script that holds it."""
    where = tasks_holding(lines)
    counts = collections.Counter()
    for task, mine in lines.items():
        docs = docstring_lines(projects[task] / script)
        counts.update(kind(line, docs, where[line]) for line in mine if len(where[line]) > 1)
    return counts


def split(by_kind: collections.Counter) -> tuple[int, int]:
    """(the shared lines every task's interface holds: its signatures, run commands, imports and
    one-line calls of the machinery; the competition code two or three tasks share). The first is
    what the measure keeps while the tasks keep this interface: its floor."""
    competition = sum(n for name, n in by_kind.items() if name.startswith("competition code of "))
    return sum(by_kind.values()) - competition, competition


def holders(lines: dict[str, list[str]]) -> list[tuple[int, list[str], str]]:
    """Each line standing in two or more tasks' scripts: (how many times it is counted, the tasks, the
    line), the most counted first: where a change would be made more than once."""
    where = tasks_holding(lines)
    counted = collections.Counter(line for mine in lines.values() for line in mine if len(where[line]) > 1)
    return sorted(((n, sorted(where[line]), line) for line, n in counted.items()), key=lambda r: (-r[0], r[2]))


def measure(work: Path, by_kind: bool = False, by_line: bool = False) -> dict[str, tuple]:
    """Per script: (shared lines, all lines, each task's share, the shared lines by kind or None,
    each shared line with its tasks or None)."""
    projects = {task: render(work / task, task=task, **answers) for task, answers in TASKS.items()}
    measured = {}
    for script in SCRIPTS:
        lines = script_lines(projects, script)
        by_kind_counts = kinds(lines, projects, script) if by_kind else None
        measured[script] = (*shared(lines), by_kind_counts, holders(lines) if by_line else None)
    return measured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", action="store_true", help="also what the shared lines are, by kind")
    p.add_argument("--lines", action="store_true", help="also each shared line, with the tasks that hold it")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kagtpl-dup-") as tmp:
        for script, (same, total, per_task, by_kind, by_line) in measure(Path(tmp), args.kinds, args.lines).items():
            tasks = ", ".join(f"{t} {share:.0%}" for t, share in per_task.items())
            share = same / max(total, 1)
            print(f"{script}: {same} of {total} lines ({share:.1%}) stand in another task's {script} ({tasks})")
            for name, n in (by_kind or collections.Counter()).most_common():
                print(f"  {n:4d}  {name}")
            if by_kind:
                interface, competition = split(by_kind)
                print(
                    f"  the interface every task implements: {interface} ({interface / max(total, 1):.1%}, this "
                    f"interface's floor); competition code two or three tasks share: {competition} "
                    f"({competition / max(total, 1):.1%})"
                )
            for n, where, line in by_line or []:
                print(f"  {n}  {','.join(where)}  {line}")


if __name__ == "__main__":
    main()
