"""The CSVs this project wrote (folds, OOF and test predictions), read back: whole, or
errors.Damaged. Every write is atomic (storage.atomic_write), so a file that is empty or cut
short was damaged after it was written: a full disk, a copy or a download stopped midway. A reader
that can do without the file leaves it out with one line (read_if_whole). It is machinery:
`copier update` may replace it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import Damaged

TEXT_COLUMNS = {0: str, "signature": str, "run": str}  # ids and run signatures: never numbers


def read_ours(path: Path, **kwargs):
    """A CSV this project wrote (folds, OOF and test predictions): its first column, the id, and
    the columns that carry run signatures as text ("00200", "NA" and "null" are ids; a signature
    of hex digits such as 3226e4661147, about 1 in 250, read as a number was `inf`), and only
    empty cells missing.
    A file that is empty, cut short or does not parse is errors.Damaged (check_whole)."""
    import pandas as pd

    check_whole(path)
    try:
        return pd.read_csv(path, dtype=TEXT_COLUMNS, keep_default_na=False, na_values=[""], **kwargs)
    except ValueError as e:  # pandas' ParserError and EmptyDataError, and UnicodeDecodeError, are ValueErrors
        raise Damaged(path, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}") from None


def check_whole(path: Path) -> None:
    """errors.Damaged unless `path` holds something and ends with a newline, as each text file this
    project writes does (to_csv ends every row with one): a file cut at a byte ends mid-line. Half
    an OOF file parsed, its cut last row as missing values (a NaN the metric raised on), or a row short."""
    last = last_byte(path)
    if not last:
        raise Damaged(path, "empty: 0 bytes")
    if last != b"\n":
        raise Damaged(path, f"cut short: its {Path(path).stat().st_size} bytes end mid-line")


def last_byte(path: Path) -> bytes:
    """The file's last byte (b"" when it is empty): a line-ended file's is a newline."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 1))
        return f.read(1)


def read_if_whole(path: Path, left_out: str):
    """read_ours for a file its reader can do without: None when there is none, or when it does
    not read back, with `left_out` printed (its {name} and {why} filled in)."""
    if not Path(path).is_file():
        return None
    try:
        return read_ours(path)
    except Damaged as e:
        print(left_out.format(name=Path(path).name, why=e.why))
        return None
