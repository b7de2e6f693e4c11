"""One writer per output folder: a POSIX lock on <out-dir>/.train.lock, held by train.py while
it trains and by predict.py while it predicts, and run.py's check before it starts anything (the
folder can be written, nobody holds it, and it is not inside the data folder). The OS releases a
lock when its process ends, however it ends, so a lock is never stale. It is machinery: `copier
update` may replace it.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from . import hardware
from .errors import RunError

_LOCKS = []  # the open lock files: the OS releases a lock when its process ends, however it ends
LOCK_FILE = ".train.lock"
RUN_LOCK = ".run.lock"  # run.py's own, held for its whole run: its train.py and predict.py take LOCK_FILE in turn


def lock_output(out_dir: Path, who: str = "train.py", wait: float = 0.0, name: str = LOCK_FILE) -> None:
    """One writer per output folder: a second train.py would overwrite the first's checkpoints,
    and a predict.py would write its submission into a folder a train.py is still training in.
    A POSIX lock (lockf) on out_dir/.train.lock, held to the process's end: the OS releases it
    however the process ends, so it is never stale; unlike flock, forked DataLoader workers do
    not inherit it (a killed run's workers, still exiting, would hold it for seconds). `wait`:
    seconds to wait for the holder to end (predict.py after run.py died: its train.py saves).
    `name`: RUN_LOCK for run.py's, so two run.py started at one instant (both past check_free
    before either train.py locks) are one run and one ERROR line."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        return
    try:
        f = open(Path(out_dir) / name, "a+")  # noqa: SIM115 (held open: the lock is the open file)
    except OSError as e:
        raise RunError(f"--out-dir {out_dir}: cannot be written ({e.strerror}); pass a folder you can write") from None
    t_end = time.time() + wait
    while True:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.time() < t_end:
                time.sleep(0.2)
                continue
            holder = lock_text(f)
            f.close()
            raise RunError(
                f"{out_dir} is in use by another {holder}: wait for it, stop it, or pass another --out-dir"
            ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()} {who}")
    f.flush()
    _LOCKS.append(f)


def lock_text(f) -> str:
    """The holder a lock file names: "train.py (pid 4242)"; a file of an older kagtpl holds the pid alone."""
    f.seek(0)
    words = f.read().split()
    pid, who = (words + ["?", "train.py"])[:2] if words else ("?", "train.py")
    return f"{who} (pid {pid})"


def lock_holder(out_dir: Path) -> str | None:
    """Who holds out_dir's lock ("train.py (pid 4242)"), or None when it is free (or unlocked)."""
    try:
        import fcntl

        f = open(Path(out_dir) / LOCK_FILE)  # noqa: SIM115
    except (ImportError, OSError):
        return None
    with f:
        try:
            fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return lock_text(f)
        fcntl.lockf(f, fcntl.LOCK_UN)
    return None


def check_free(out_dir: Path) -> None:
    """run.py's check before it starts anything: out_dir exists (made if not), can be written,
    and no train.py or predict.py holds it. Each failure is a RunError naming the folder."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=f".write-check.{os.getpid()}.", suffix=".tmp")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise RunError(f"--out-dir {out_dir}: cannot be written ({e.strerror}); pass a folder you can write") from None
    holder = lock_holder(out_dir)
    if holder:
        raise RunError(f"{out_dir} is in use by another {holder}: wait for it, stop it, or pass another --out-dir")


def check_apart(data_dir, out_dir) -> None:
    """--out-dir inside --data-dir (the data in the project folder, --data-dir .; the data unpacked
    into /kaggle/working) is refused before anything is written: each run's files would change the
    data's fingerprint (artifacts.data_fingerprint), and every later run would train each fold again
    as "other data". A run folder in the project, in a data folder that holds the project, is fine:
    the fingerprint leaves the project out."""
    data, out = Path(data_dir).resolve(), Path(out_dir).resolve()
    in_project = out.is_relative_to(hardware.PROJECT) and data != hardware.PROJECT and hardware.holds_project(data)
    if out.is_relative_to(data) and not in_project:
        raise RunError(
            f"--out-dir {out_dir} is inside --data-dir {data_dir}: what a run writes would change the data's run "
            "signature, and every later run would train each fold again; keep the data in a folder of its own "
            "(data/, say) and pass that as --data-dir, or give --out-dir a folder outside it"
        )
