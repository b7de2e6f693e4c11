"""Render a kagtpl project into a temporary folder and import its modules, so a benchmark
measures the generated code itself."""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


MODULES = ("train", "engine", "gpu", "hardware", "planner")
EXTRA = {"image": ("images",), "text": ("texts",)}  # task-only modules


def rendered(task: str, extra_modules: tuple = (), **answers):
    """A namespace of a freshly rendered project's modules: .train, .engine, .gpu, .hardware, .planner
    (and .images for an image project), and any `extra_modules` of it (tune, tuning)."""
    import copier

    dest = Path(tempfile.mkdtemp(prefix=f"kagtpl-bench-{task}-")) / "proj"
    data = {"project_name": "bench", "task": task, "gpu": "cpu", **answers}
    copier.run_copy(str(ROOT), dest, data=data, defaults=True, vcs_ref="HEAD", quiet=True)
    sys.path.insert(0, str(dest))
    names = (*MODULES, *EXTRA.get(task, ()), *extra_modules)
    for name in names:
        sys.modules.pop(name, None)
    return SimpleNamespace(**{m: importlib.import_module(m) for m in names})
