"""The folder where a script's DataLoader workers bind their sockets: multiprocessing's temp folder,
through which torch's file_descriptor sharing hands each batch's tensors to the main process.

Left to itself, each worker makes its own folder (TMPDIR/pymp-XXXXXXXX) and removes it at its exit.
A SIGKILL runs no exit: a killed train.py left one folder per worker, ~10 in /tmp after each full
test suite, 80 after a day. So the main process makes the folder once, before its workers fork
(they inherit it through multiprocessing's own cache), names it for its pid (pymp-k<pid>-XXXXXXXX),
and removes it at its end (errors.end_now too); a folder whose process is gone is removed by the
next script that makes one: under run.py, predict.py removes a killed train.py's. Where TMPDIR is
too long for a socket's path, the folder goes to /tmp (or /var/tmp, /dev/shm) instead. It is
machinery: `copier update` may replace it.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile

from . import errors
from .storage import pid_alive

# A Linux AF_UNIX socket's path holds 107 bytes (sun_path, less its NUL). multiprocessing binds its
# sockets at <folder>/listener-XXXXXXXX, and each DataLoader worker binds one to hand its batches'
# tensors over. With a TMPDIR over 75 bytes the bind failed in the worker's feeder thread, the worker
# lived on, and train.py waited for a batch that never came, through SIGTERM too, until a budget's
# kill handed in the fallback (a pytest tmp_path as TMPDIR: 76 bytes). CPython 3.14 falls back to a
# short folder itself; this does it before.
SOCKET_PATH_MAX = 107
LISTENER = len("/listener-XXXXXXXX")
PREFIX = "pymp-k"  # then the pid and "-": multiprocessing's own names (pymp-XXXXXXXX) never hold a "-"
NAMED = len(f"/{PREFIX}4194304-XXXXXXXX")  # the longest pid Linux gives
SHORT_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")


def socket_dir() -> str | None:
    """This process's folder for its loader workers' sockets (made once, swept first), or None when
    none can be made: the workers then make their own, as before."""
    process = multiprocessing.current_process()
    made = process._config.get("tempdir")  # multiprocessing.util.get_temp_dir's own cache
    if made and len(os.fsencode(made)) + LISTENER <= SOCKET_PATH_MAX:
        return made
    for base in bases():
        sweep(base)
        try:
            folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base)
        except OSError:
            continue
        multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
        errors.at_end_now(functools.partial(shutil.rmtree, folder, True))  # os._exit skips the Finalize
        process._config["tempdir"] = folder
        return folder
    return None


def bases() -> list[str]:
    """Where the folder may go: TMPDIR when a socket's path fits under it, else the short folders
    this user can write."""
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) + NAMED + LISTENER <= SOCKET_PATH_MAX:
        return [base]
    return [s for s in SHORT_FOLDERS if os.path.isdir(s) and os.access(s, os.W_OK | os.X_OK)]


def sweep(base: str) -> list[str]:
    """Remove the folders this module made in `base` whose process is gone; returns their names."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    gone = []
    for name in names:
        pid, dash, _ = name[len(PREFIX) :].partition("-") if name.startswith(PREFIX) else ("", "", "")
        if dash and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            gone.append(name)
    return gone
