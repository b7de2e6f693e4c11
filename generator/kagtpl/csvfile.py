"""Reading a competition's CSV the way the generated project reads it (machinery/storage.read_csv):
UTF-8 with or without a byte-order mark, the separator of the file's own header line (the
project's own rule, storage.separator: a comma, else a semicolon or a tab), header names stripped
of spaces. Values are kept as text: "NA", "None" and "null" are labels here, not missing values."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from kagtpl.template import template_module


def read(path: Path, limit: int | None = None) -> tuple[list[str], Iterator[list[str]]]:
    """The header (stripped) and an iterator over the data rows (as read, quoted newlines kept)."""
    delimiter = template_module("storage").separator(path)
    f = open(path, newline="", encoding="utf-8-sig", errors="replace")  # noqa: SIM115  (closed by rows())
    reader = csv.reader(f, delimiter=delimiter)
    header = [h.strip() for h in next(reader, [])]

    def rows() -> Iterator[list[str]]:
        with f:
            for i, row in enumerate(reader):
                if limit is not None and i >= limit:
                    return
                yield row

    return header, rows()


def header(path: Path) -> list[str]:
    head, rows = read(path, limit=0)
    list(rows)  # closes the file
    return head


def dict_rows(path: Path, limit: int | None = None) -> Iterator[dict[str, str]]:
    """The data rows as {header name: value}, header names stripped."""
    head, rows = read(path, limit)
    for row in rows:
        yield dict(zip(head, row, strict=False))  # a short row: its missing cells are absent
