"""Render a kagtpl project into a temporary folder and import its modules, so a benchmark
measures the generated code itself."""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rendered(task: str, **answers):
    """(train, kit, hardware) modules of a freshly rendered project."""
    import copier

    dest = Path(tempfile.mkdtemp(prefix=f"kagtpl-bench-{task}-")) / "proj"
    data = {"project_name": "bench", "task": task, "gpu": "cpu", **answers}
    copier.run_copy(str(ROOT), dest, data=data, defaults=True, vcs_ref="HEAD", quiet=True)
    sys.path.insert(0, str(dest))
    for name in ("train", "kit", "hardware"):
        sys.modules.pop(name, None)
    return tuple(importlib.import_module(m) for m in ("train", "kit", "hardware"))
