"""Room on a full disk for the one file a run exists to write: the submission.

Kaggle's working disk holds 20 GB, and a run's checkpoints, OOF rows and decode caches can fill
it. A predict.py whose submission.csv the disk refused handed in train.py's fallback (the
training prior) beside its trained folds: an ERROR line, and a score of the prior. The output
folder's `cache/` holds the only files a run makes again from the data alone (decoded images,
audio and masks; token caches), so when the disk refuses the submission they are removed, with
one CLEANUP line saying how much they held, and the write is tried once more. A cache
file still mapped by this process (predict.py's test cache) gives its room back only when it is
closed: the rest of the folder is what is freed. Kept: a cache tune.py's trials share (a link:
the other trials read it) and a live writer's temporary file. Torch-free. It is machinery:
`copier update` may replace it.
"""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

from . import storage
from .errors import DiskFull


def write_csv(df, path: Path) -> None:
    """storage.write_csv_atomic; when the disk refuses it, the cache beside it freed and one more try
    (still full: the DiskFull of that try, the previous file intact)."""
    path = Path(path)
    try:
        storage.write_csv_atomic(df, path)
    except DiskFull:
        free = shutil.disk_usage(path.parent).free / 2**20
        freed = free_cache(path.parent)
        if freed is None:
            raise
        print(f"CLEANUP: the disk refused {path.name} ({free:.1f} MB free): {freed}")
        storage.write_csv_atomic(df, path)


def free_cache(out: Path) -> str | None:
    """Removes the files of out/cache (none when it is a link); says what they held, or None when
    there was nothing to remove."""
    folder = Path(out) / "cache"
    if folder.is_symlink() or not folder.is_dir():
        return None
    files = [f for f in folder.iterdir() if f.is_file() and not live_tmp(f)]
    if not files:
        return None
    mb = sum(f.stat().st_blocks * 512 for f in files) / 2**20  # their blocks on the disk
    gc.collect()  # a cache array no longer referenced is unmapped: its removal frees its blocks
    for f in files:
        f.unlink(missing_ok=True)
    return f"removed the cache {folder} ({len(files)} file(s), {mb:.1f} MB; the next run makes it again)"


def live_tmp(path: Path) -> bool:
    """A temporary file a live process is writing (storage.TMP_PID: its name carries the writer's pid)."""
    m = storage.TMP_PID.search(path.name)
    return bool(m) and (int(m.group(1)) == os.getpid() or storage.pid_alive(int(m.group(1))))
