"""tune.py's study storage: the journal file output/tune/optuna.journal (several processes of one
machine append to it under optuna's lock; a last record cut mid-write is removed before it is
opened), or an optuna RDB URL (--storage, PostgreSQL or MySQL for several machines). The rules are
in kagtpl's docs/tuning.md. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import RunError


def redact(url: str) -> str:
    """An RDB URL as printed: its password hidden."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def describe_storage(url: str, folder: Path) -> str:
    return redact(url) if url else f"journal file {folder / 'optuna.journal'}"


def open_storage(url: str, folder: Path):
    """The journal file (processes append under a file lock: SQLite said "database is locked"), or an RDB URL."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if not url:
        folder.mkdir(parents=True, exist_ok=True)
        # absolute: optuna's lock symlinks to the journal; a relative target dangled, a killed holder's lock lived on
        path = (folder / "optuna.journal").resolve()
        if cut := mend_journal(path):
            print(
                f"WARNING: {path}: its last record was cut short ({cut} bytes: a kill or a full disk mid-write): "
                "removed; the study resumes from the records before it"
            )
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if "://" not in url:
        raise RunError(
            f"--storage {url!r}: give an optuna RDB URL (sqlite:///tune.db for one process, "
            "postgresql://user:pass@host/db for several machines), or leave it out for the journal file"
        )
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as e:  # sqlalchemy's: server down, driver missing, bad URL; one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RunError(f"--storage {redact(url)}: cannot open it ({type(e).__name__}: {first})") from None


def mend_journal(path: Path) -> int:
    """The bytes cut from the journal's end: its last record, when a full disk or a kill cut it
    mid-write (no newline after it). optuna reads past such a tail, but its next append glued a
    record onto it, a line that never parsed again: every later tune.py died on it (JSONDecodeError)
    instead of resuming. Done under optuna's own lock, which its appends take: a record being
    written is never taken for a cut one."""
    from optuna.storages.journal import JournalFileSymlinkLock

    if not path.is_file():
        return 0
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, 2)  # from the end: the file's size
            f.seek(max(0, size - 65536))  # a record is a few hundred bytes: its start is in the last 64 KiB
            tail = f.read()
            if not tail or tail.endswith(b"\n"):
                return 0
            keep = size - len(tail) + tail.rfind(b"\n") + 1  # after the last whole record (0: there is none)
            f.truncate(keep)
            return size - keep
    finally:
        lock.release()
