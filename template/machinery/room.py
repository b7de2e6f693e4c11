"""Room on a full disk for what a run exists to write: the submission, and a fold's checkpoint.

Kaggle's working disk holds 20 GB, and a run's checkpoints, OOF rows and decode caches can fill
it. A predict.py whose submission.csv the disk refused handed in train.py's fallback (the
training prior) beside its trained folds: an ERROR line, and a score of the prior. The output
folder's `cache/` holds the only files a run makes again from the data alone (decoded images,
audio and masks; token caches), so when the disk refuses the submission they are removed, with
one CLEANUP line saying how much they held, and the write is tried once more. A fold's
checkpoint the disk refuses gets the room of the test set's cache train.py made ahead for
predict.py (AHEAD: predict.py decodes the test set itself then); the training set's cache is in
use. A cache file still mapped by this process gives its room back only when it is closed. Kept: a
cache tune.py's trials share (a link: the other trials read it) and a live writer's temporary file;
a killed writer's is swept as a run starts (sweep_stale_tmp). Torch-free. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
from pathlib import Path

from . import storage
from .errors import DiskFull

AHEAD = re.compile(r"(tokens-)?test[_-]")  # the test set's caches (images, clips, tokens): predict.py's


def write_csv(df, path: Path, ahead: bool = False) -> None:
    """storage.write_csv_atomic, with the room of the cache beside it when the disk refuses it
    (`ahead`: the test set's alone, as train.py's fallback: its training cache is in use)."""
    with_room(path, lambda: storage.write_csv_atomic(df, path), ahead)


def with_room(path: Path, write, ahead: bool = False):
    """write() (an atomic write of `path`), and what it returns; when the disk refuses it, the
    cache beside it removed (`ahead`: the test set's alone, for train.py's checkpoints and
    fallback) and one more try (still full: the DiskFull of that try, the previous file intact)."""
    path = Path(path)
    try:
        return write()
    except DiskFull:
        free = shutil.disk_usage(path.parent).free / 2**20
        freed = free_cache(path.parent, ahead)
        if freed is None:
            raise
        print(f"CLEANUP: the disk refused {path.name} ({free:.1f} MB free): {freed}")
        return write()


def free_cache(out: Path, ahead: bool = False) -> str | None:
    """Removes the files of out/cache (`ahead`: the test set's alone; none when it is a link); says
    what they held, or None when there was nothing to remove."""
    folder = Path(out) / "cache"
    if folder.is_symlink() or not folder.is_dir():
        return None
    files = [f for f in folder.iterdir() if f.is_file() and not live_tmp(f) and (AHEAD.match(f.name) or not ahead)]
    if not files:
        return None
    mb = sum(held_bytes(f) for f in files) / 2**20
    gc.collect()  # a cache array no longer referenced is unmapped: its removal frees its blocks
    for f in files:
        f.unlink(missing_ok=True)
    which, again = (
        ("the test set's cache", "predict.py decodes it again")
        if ahead
        else ("the cache", "the next run makes it again")
    )
    return f"removed {which} {folder} ({len(files)} file(s), {mb:.1f} MB; {again})"


def held_bytes(path: Path) -> int:
    """The disk a file takes: its blocks (a reserved, sparse or tail-padded file), else its size."""
    st = path.stat()
    return getattr(st, "st_blocks", 0) * 512 or st.st_size


def live_tmp(path: Path) -> bool:
    """A temporary file a live process is writing (storage.TMP_PID: its name carries the writer's pid)."""
    m = storage.TMP_PID.search(Path(path).name)
    return bool(m) and (int(m.group(1)) == os.getpid() or storage.pid_alive(int(m.group(1))))


def sweep_stale_tmp(out_dir: Path) -> None:
    """Delete the temporary files killed runs left in out_dir and its cache (a kill mid-write
    leaves one, up to the size of a checkpoint or a decode cache); a live writer's are kept."""
    stale = [
        f
        for folder in (Path(out_dir), Path(out_dir) / "cache")
        if folder.is_dir()
        for f in folder.iterdir()
        if storage.TMP_PID.search(f.name) and not live_tmp(f)
    ]
    mb = sum(f.stat().st_size for f in stale) / 2**20
    for f in stale:
        f.unlink(missing_ok=True)
    if stale:
        print(f"CLEANUP: removed {len(stale)} temporary file(s) ({mb:.0f} MB) left by killed runs in {out_dir}")
