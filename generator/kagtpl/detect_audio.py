"""`kagtpl new --task audio --data DIR`: the layout of an audio competition, BirdCLEF's or one like it.

Training clips by folder (train_audio/<label>/<clip>) or by a metadata CSV (file, primary label,
secondary labels, rating; Freesound's train_curated.csv: fname and labels "Bark,Dog"); the test
as long recordings scored per window (row ids <recording>_<end second>) or a row per clip. The
label columns are sample_submission's."""

from __future__ import annotations

import re
from pathlib import Path

from kagtpl.detect import _first_value, _header, _pick, _pick_submission
from kagtpl.errors import KagtplError

AUDIO_KEYS = (
    "train_dir", "train_csv", "file_col", "label_col", "secondary_col", "rating_col", "test_dir", "test_layout",
    "sample_submission", "metric",
)  # fmt: skip
AUDIO_EXTS = (".ogg", ".wav", ".flac", ".mp3", ".opus")
TRAIN_DIRS, TEST_DIRS = ("train_audio", "train", "audio"), ("test_soundscapes", "test_audio", "test")
METADATA = ("train_metadata.csv", "train.csv")  # after <train_dir>.csv (Freesound's train_curated.csv)
COLUMNS = {
    "file_col": ("filename", "file", "fname", "path", "audio"),
    "label_col": ("primary_label", "label", "labels", "species", "class"),
    "secondary_col": ("secondary_labels",),
    "rating_col": ("rating",),
}
WINDOW_ID = re.compile(r".+_\d+")


def has_audio(folder: Path) -> bool:
    return folder.is_dir() and any(p.suffix.lower() in AUDIO_EXTS for p in folder.rglob("*") if p.is_file())


def train_dirs(data: Path, given: str | None) -> list[str]:
    """The folders the training clips may be in: TRAIN_DIRS, then the one train*/ folder of audio
    there is (Freesound's train_curated/); several of those, and none of TRAIN_DIRS, are an error
    that names them (train_curated/ and train_noisy/: one project learns from one folder)."""
    if given or any(has_audio(data / d) for d in TRAIN_DIRS):
        return list(TRAIN_DIRS)
    found = sorted(p.name for p in data.glob("train*") if p.name not in TRAIN_DIRS and has_audio(p))
    if len(found) > 1:
        raise KagtplError(
            f"--data {data}: {len(found)} folders of training audio ({', '.join(found)}): name one with --train-dir"
        )
    return [*TRAIN_DIRS, *found]


def detect_audio(data: Path, overrides: dict[str, str | None]) -> dict[str, str]:
    o = {k: overrides.get(k) for k in AUDIO_KEYS}
    sample = _pick_submission(data, o["sample_submission"], "submission CSV", "an audio")
    if len(_header(data / sample)) < 2:
        raise KagtplError(f"{data / sample}: needs a row id column and a column per label")
    dirs = train_dirs(data, o["train_dir"])
    train_dir = _pick(data, o["train_dir"], dirs, "training audio folder", has_audio, "an audio")
    train_csv = o["train_csv"]
    if train_csv is None:
        train_csv = next((name for name in (f"{train_dir}.csv", *METADATA) if (data / name).is_file()), "")
    found = {"train_dir": train_dir, "train_csv": train_csv, "sample_submission": sample}
    if train_csv:
        columns = _header(data / train_csv)
        for key, candidates in COLUMNS.items():
            given = o[key]
            if given and given not in columns:
                raise KagtplError(f"--{key.replace('_', '-')} {given}: not a column of {data / train_csv} ({columns})")
            found[key] = given or next((c for c in candidates if c in columns), "")
        for key in ("file_col", "label_col"):
            if not found[key]:
                raise KagtplError(f"{data / train_csv}: no {key.split('_')[0]} column; pass --{key.replace('_', '-')}")
    test_dir = o["test_dir"] or next((d for d in TEST_DIRS if (data / d).is_dir()), TEST_DIRS[0])
    first = _first_value(data / sample, _header(data / sample)[0]) or ""
    clip = any((data / test_dir / f"{first}{ext}").is_file() for ext in ("", *AUDIO_EXTS))  # Freesound: a.wav
    layout = o["test_layout"] or ("windows" if WINDOW_ID.fullmatch(first) and not clip else "clips")
    found.update({"test_dir": test_dir, "test_layout": layout, "metric": o["metric"] or "auc"})
    if found["metric"] not in ("auc", "cmap"):
        raise KagtplError(f"metric {found['metric']!r}: audio is scored by auc or cmap")
    return found
