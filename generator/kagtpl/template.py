"""Where the Copier template lives, and the template's own hardware rules."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parent


def template_root() -> Path:
    """The folder holding copier.yml: packaged inside the wheel, or the source checkout."""
    for root in (PACKAGE_DIR / "_template", PACKAGE_DIR.parent.parent):
        if (root / "copier.yml").is_file() and (root / "template").is_dir():
            return root
    raise FileNotFoundError(f"kagtpl's template is missing next to {PACKAGE_DIR}; reinstall kagtpl")


def is_git_checkout(root: Path) -> bool:
    return (root / ".git").exists()


@cache
def hardware() -> ModuleType:
    """template/hardware.py: the same GPU table and rules the generated train.py uses."""
    path = template_root() / "template" / "hardware.py"
    spec = importlib.util.spec_from_file_location("kagtpl_template_hardware", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module
