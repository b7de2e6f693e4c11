"""Where the Copier template comes from, and the template's own hardware rules.

Template versions are kagtpl versions: release v0.2.0 is the git tag `v0.2.0` of the kagtpl
repository. Three sources, in this order:

- a source checkout (this file sits in the repo's generator/kagtpl/): the repo itself, at HEAD
  with any uncommitted changes (for developing the template);
- an installed wheel: the git bundle `kagtpl/_template.bundle` that the build put in the wheel,
  holding every released version as a tag. It is copied to a stable per-user path, so the
  `_src_path` a project records survives upgrades, and refreshed whenever kagtpl runs;
- a wheel built without git (from an sdist): the plain folder `kagtpl/_template`; projects
  render but cannot be updated.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from kagtpl import __version__
from kagtpl.errors import KagtplError

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT = PACKAGE_DIR.parent.parent
PACKAGED_BUNDLE = PACKAGE_DIR / "_template.bundle"


def template_root() -> Path:
    """A folder holding copier.yml and template/ (for reading files, e.g. hardware.py)."""
    for root in (CHECKOUT, PACKAGE_DIR / "_template"):
        if (root / "copier.yml").is_file() and (root / "template").is_dir():
            return root
    raise KagtplError(f"kagtpl's template is missing next to {PACKAGE_DIR}; reinstall kagtpl")


def is_git_checkout(root: Path) -> bool:
    return (root / ".git").exists()


def version_tag(version: str = __version__) -> str:
    return version if version.startswith("v") or version == "HEAD" else f"v{version}"


def stable_bundle_path() -> Path:
    """Per-user, version-independent: $KAGTPL_HOME, else $XDG_DATA_HOME/kagtpl, else ~/.local/share/kagtpl."""
    home = os.environ.get("KAGTPL_HOME")
    if not home:
        home = str(Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "kagtpl")
    return Path(home) / "template.bundle"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refresh_stable_bundle() -> Path | None:
    """Copy the installed wheel's bundle to the stable path when it differs (after an upgrade)."""
    if not PACKAGED_BUNDLE.is_file():
        return None
    target = stable_bundle_path()
    if not target.is_file() or _digest(target) != _digest(PACKAGED_BUNDLE):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".template.", suffix=".tmp")
        os.close(fd)
        shutil.copyfile(PACKAGED_BUNDLE, tmp)
        os.replace(tmp, target)
    return target


def tags(src: str) -> list[str]:
    """Version tags of a git source (repo or bundle), offline."""
    path = Path(src)
    cmd = (
        ["git", "bundle", "list-heads", str(path)] if path.is_file() else ["git", "-C", str(path), "show-ref", "--tags"]
    )
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    refs = [line.split()[-1] for line in out.splitlines() if " refs/tags/" in line]
    return [r.removeprefix("refs/tags/") for r in refs if r.removeprefix("refs/tags/").startswith("v")]


@dataclass(frozen=True)
class Source:
    path: str  # what Copier records as _src_path: absolute and stable
    ref: str | None  # vcs_ref for a new project; None for a plain folder
    updatable: bool


def source() -> Source:
    """Where `kagtpl new` renders from (see the module docstring)."""
    if is_git_checkout(CHECKOUT) and (CHECKOUT / "copier.yml").is_file():
        return Source(str(CHECKOUT), "HEAD", True)
    bundle = refresh_stable_bundle()
    if bundle is not None:
        tag = version_tag()
        return Source(str(bundle), tag if tag in tags(str(bundle)) else "HEAD", True)
    return Source(str(template_root()), None, False)


# The template's torch-free machinery modules the generator shares. They are loaded as modules of
# the template's own `machinery` package (under another name, so nothing in sys.modules clashes),
# so their relative imports find each other exactly as in the generated project.
SHARED_MODULES = (
    "errors",
    "profiles",
    "hardware",
    "planner",
    "replanning",
    "report",
    "storage",
    "adapters",
    "tasks",
    "text_sizing",
    "logs",
    "hand_in",
)
PACKAGE = "kagtpl_template_machinery"


@cache
def machinery_package() -> ModuleType:
    """template/machinery/ as a package named kagtpl_template_machinery (its __init__ imports nothing)."""
    folder = template_root() / "template" / "machinery"
    init = folder / "__init__.py"
    if not init.is_file():
        raise KagtplError(f"kagtpl's template has no machinery package (looked in {folder}); reinstall kagtpl")
    spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    return package


class _SourceWithoutBytecode(importlib.machinery.SourceFileLoader):
    """A Jinja-named module's loader that writes no bytecode: Python would name its cache after the
    file's stem, `__pycache__/{% if task == 'text' %}adapters.cpython-311.pyc`, a path Copier renders
    as a template (an unclosed `if`), and every later `kagtpl new` from that folder would fail."""

    def set_data(self, path, data, *, _mode=0o666) -> None:
        return None


@cache
def template_module(name: str) -> ModuleType:
    """A torch-free module of the template (hardware.py, planner.py), loaded from its file, so
    `kagtpl recommend` and the generated train.py apply the very same rules and numbers."""
    if name not in SHARED_MODULES:
        raise KagtplError(f"template module {name!r} is not one the generator shares: {', '.join(SHARED_MODULES)}")
    package = machinery_package()
    folder = Path(package.__path__[0])
    if (folder / f"{name}.py").is_file():
        return importlib.import_module(f"{PACKAGE}.{name}")
    # a task's own module is named by its Jinja condition: {% if task == 'text' %}adapters.py{% endif %}
    found = sorted(folder.glob(f"*%}}{name}.py{{% endif %}}"))
    if not found:
        raise KagtplError(f"kagtpl's template has no machinery/{name}.py; reinstall kagtpl")
    loader = _SourceWithoutBytecode(f"{PACKAGE}.{name}", str(found[0]))  # not named *.py
    spec = importlib.util.spec_from_file_location(loader.name, found[0], loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def adapters() -> ModuleType:
    """template/machinery/adapters.py (text): a model's size from its config, LoRA's memory rules."""
    return template_module("adapters")


def profiles() -> ModuleType:
    """template/machinery/profiles.py: the GPU table and the detected card's profile."""
    return template_module("profiles")


def text_sizing() -> ModuleType:
    """template/machinery/text_sizing.py (text): a transformer's batch, max_len cap and checkpointing rules."""
    return template_module("text_sizing")


def hardware() -> ModuleType:
    """template/hardware.py: the GPU table and rules the generated train.py uses."""
    return template_module("hardware")


def tasks() -> ModuleType:
    """template/machinery/tasks.py: the task registry (names, plan defaults, what each needs)."""
    return template_module("tasks")


def planner() -> ModuleType:
    """template/planner.py: the time planner's constants and the budget parser."""
    return template_module("planner")


def replanning() -> ModuleType:
    """template/replanning.py: the rules that change a plan while it trains (their fractions)."""
    return template_module("replanning")
