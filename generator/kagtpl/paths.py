"""Folders the CLI writes to: checked before anything is written, and left as found on failure."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
from pathlib import Path

from kagtpl.errors import KagtplError


def data_files(folder: Path, pattern: str = "*", deep: bool = False) -> list[Path]:
    """The files of a data folder that `pattern` matches, sorted: no folder and no hidden file
    (.DS_Store, and macOS's ._<name> beside each file, its metadata under the file's own extension),
    as the project's scripts read them (images.listable); `deep`: in its folders too."""
    if not folder.is_dir():
        return []
    found = folder.rglob(pattern) if deep else folder.glob(pattern)
    return sorted(p for p in found if p.is_file() and not p.name.startswith("."))


def check_writable_folder(folder: Path, flag: str) -> None:
    """`folder` is, or can be made as, a writable folder: its nearest existing ancestor is a
    writable folder (a file or a read-only place on the way is an error before anything is written)."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise KagtplError(f"{flag} {folder}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise KagtplError(f"{flag} {folder}: {existing} is not writable")


def data_folder(folder: Path, flag: str = "--data") -> Path:
    """The competition folder, resolved: a symlink loop (or one that points nowhere) is an error
    naming it, not pathlib's RuntimeError."""
    try:
        resolved = folder.resolve(strict=True)
    except RuntimeError as e:  # Python 3.11-3.12: pathlib's "Symlink loop from ..."
        raise KagtplError(f"{flag} {folder}: a symlink loop (it leads back to itself)") from e
    except OSError as e:
        why = "a symlink loop (it leads back to itself)" if e.errno == errno.ELOOP else "no such folder"
        raise KagtplError(f"{flag} {folder}: {why}") from e
    if not resolved.is_dir():
        raise KagtplError(f"{flag} {folder}: not a folder")
    return resolved


def made_parents(folder: Path) -> list[Path]:
    """The folders `folder.mkdir(parents=True)` would create, deepest first (removed again on failure)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing


def remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:  # not empty (someone else's) or already gone
            return


def sweep_staging(parent: Path, name: str) -> None:
    """Staging folders (.<name>.<pid>.*) left by a kagtpl that was killed mid-render."""
    for tmp in parent.glob(f".{name}.*"):
        pid = tmp.name[len(name) + 2 :].split(".")[0]
        if tmp.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shell(path: Path) -> str:
    """`path` as a printed command names it: quoted for the shell where it holds a space or a quote,
    so the command runs as written."""
    return shlex.quote(str(path))
