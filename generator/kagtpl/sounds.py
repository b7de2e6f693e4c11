"""A small audio competition to try --task audio on, BirdCLEF-style: words spoken by Debian's
espeak-ng (several voices, speeds and pitches) stand in for bird calls, over pink noise.

Each label is a word. A training clip holds its word two to four times (and, in the `csv`
layout, sometimes a quieter second word: a secondary label); the test is long "soundscapes" cut
into fixed windows, each word placed wholly inside one window, so the truth of every window is
known. Layouts:

- `folders`: train_audio/<label>/<id>.ogg; test_soundscapes/<recording>.ogg; sample_submission.csv
  with a row per window, row_id `<recording>_<end second>` (BirdCLEF's form), a column per label
- `csv`: the same files, with train_metadata.csv (primary_label, secondary_labels as a Python
  list's text, filename as <label>/<id>.ogg, rating 1-5), as BirdCLEF ships it
- `clips`: train_audio/<label>/<id>.wav; test_audio/<id>.wav, one row per clip

Audio is written at 32 kHz (BirdCLEF's rate), Ogg Vorbis or WAV. Beside the folder,
<folder>_solution.csv holds the test's truth (the sample's rows, 0/1 per label) for scoring.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from kagtpl.errors import KagtplError
from kagtpl.shapes import write_csv

LAYOUTS = ("folders", "csv", "clips")
WORDS = ("apple", "river", "seven", "garden", "yellow")
RATE = 32_000  # Hz: BirdCLEF's
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-gb+m4", "en-us+f5")
WINDOW = 5  # seconds per test window, as BirdCLEF scores


def espeak() -> str:
    found = shutil.which("espeak-ng")
    if not found:
        raise KagtplError("espeak-ng is not installed: it speaks the words (Debian: apt-get install espeak-ng)")
    return found


def utterances(rng, words: tuple, per_word: int) -> dict:
    """Each word spoken `per_word` times, each with its own voice, speed and pitch, at RATE: word
    -> list of float32 arrays (trimmed of silence, peak 1)."""
    import numpy as np
    import soundfile as sf
    from scipy.signal import resample_poly

    program, spoken = espeak(), {}
    with tempfile.TemporaryDirectory() as tmp:
        for word in words:
            spoken[word] = []
            for k in range(per_word):
                wav = Path(tmp) / f"{word}{k}.wav"
                voice = VOICES[(k + words.index(word)) % len(VOICES)]
                speed, pitch = int(rng.integers(110, 200)), int(rng.integers(20, 80))
                cmd = [program, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(wav), word]
                subprocess.run(cmd, check=True, capture_output=True, timeout=60)
                audio, rate = sf.read(wav, dtype="float32")
                audio = resample_poly(audio, RATE, rate).astype(np.float32)
                loud = np.flatnonzero(np.abs(audio) > 0.02 * np.abs(audio).max())
                audio = audio[loud[0] : loud[-1] + 1]
                spoken[word].append(audio / np.abs(audio).max())
    return spoken


def pink_noise(rng, n: int, level: float):
    """Noise whose power falls as 1/f (wind and distant sound), `level` its RMS."""
    import numpy as np

    spectrum = np.fft.rfft(rng.normal(size=n))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    noise = np.fft.irfft(spectrum, n)
    return (noise * level / noise.std()).astype(np.float32)


def place(track, audio, start: int, gain: float) -> None:
    end = min(len(track), start + len(audio))
    track[start:end] += gain * audio[: end - start]


def clip(rng, spoken: dict, word: str, second: str | None):
    """A training clip: 3-8 s of noise, `word` 2-4 times at full level, `second` once, quieter."""
    import numpy as np

    track = pink_noise(rng, int(rng.uniform(3, 8) * RATE), rng.uniform(0.02, 0.06))
    for _ in range(int(rng.integers(2, 5))):
        audio = spoken[word][int(rng.integers(len(spoken[word])))]
        place(track, audio, int(rng.integers(0, max(1, len(track) - len(audio)))), rng.uniform(0.4, 0.8))
    if second is not None:
        audio = spoken[second][int(rng.integers(len(spoken[second])))]
        place(track, audio, int(rng.integers(0, max(1, len(track) - len(audio)))), rng.uniform(0.15, 0.3))
    return np.clip(track, -1, 1)


def soundscape(rng, spoken: dict, words: tuple, windows: int):
    """A long test recording of `windows` windows, and the words heard in each (0-2 per window,
    each wholly inside it)."""
    import numpy as np

    span = WINDOW * RATE
    track = pink_noise(rng, windows * span, rng.uniform(0.02, 0.06))
    heard = []
    for w in range(windows):
        present = set(rng.choice(words, size=int(rng.integers(0, 3)), replace=False).tolist())
        for word in sorted(present):
            audio = spoken[word][int(rng.integers(len(spoken[word])))][: span - 1]
            place(track, audio, w * span + int(rng.integers(0, span - len(audio))), rng.uniform(0.4, 0.8))
        heard.append(present)
    return np.clip(track, -1, 1), heard


def write_sounds(
    dest: Path, layout: str = "folders", clips_per_word: int = 8, test: int = 3, windows: int = 4, seed: int = 0
) -> Path:
    """Write the competition to `dest` (and its truth to <dest>_solution.csv); returns `dest`.
    `test`: soundscapes of `windows` windows each (clips: test clips, one per row). Everything is
    checked first and written in a temporary folder moved into place whole."""
    import numpy as np

    if layout not in LAYOUTS:
        raise KagtplError(f"--layout {layout!r}: one of {', '.join(LAYOUTS)}")
    for flag, value, low in (("--clips", clips_per_word, 2), ("--test", test, 1), ("--windows", windows, 1)):
        if not low <= value <= 1000:
            raise KagtplError(f"{flag} {value}: from {low} to 1000")
    solution = dest.parent / f"{dest.name}_solution.csv"
    for path in (dest, solution):
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise KagtplError(f"{path} exists; kagtpl sounds never overwrites: pick another folder")
    espeak()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        write_competition(staging, layout, np.random.default_rng(seed), clips_per_word, test, windows)
        if dest.exists():
            dest.rmdir()  # empty: checked above
        (staging / "solution.csv").rename(solution)
        staging.chmod(0o755)  # mkdtemp makes it private
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def write_competition(dest: Path, layout: str, rng, clips_per_word: int, test: int, windows: int) -> None:
    import soundfile as sf

    spoken = utterances(rng, WORDS, 6)
    ext = ".wav" if layout == "clips" else ".ogg"
    metadata = []
    for word in WORDS:
        (dest / "train_audio" / word).mkdir(parents=True, exist_ok=True)
        for k in range(clips_per_word):
            others = [w for w in WORDS if w != word]
            second = str(rng.choice(others)) if layout == "csv" and rng.random() < 0.4 else None
            name = f"{word}/XC{k:04d}{ext}"
            sf.write(dest / "train_audio" / name, clip(rng, spoken, word, second), RATE)
            metadata.append([word, repr([second] if second else []), name, int(rng.integers(1, 6))])
    if layout == "csv":
        write_csv(dest / "train_metadata.csv", ["primary_label", "secondary_labels", "filename", "rating"], metadata)
    rows = []
    if layout == "clips":
        (dest / "test_audio").mkdir(parents=True, exist_ok=True)
        for k in range(test):
            word = WORDS[k % len(WORDS)]
            sf.write(dest / "test_audio" / f"test{k:03d}{ext}", clip(rng, spoken, word, None), RATE)
            rows.append([f"test{k:03d}", {word}])
    else:
        (dest / "test_soundscapes").mkdir(parents=True, exist_ok=True)
        for k in range(test):
            track, heard = soundscape(rng, spoken, WORDS, windows)
            sf.write(dest / "test_soundscapes" / f"soundscape_{k:03d}{ext}", track, RATE)
            rows += [[f"soundscape_{k:03d}_{WINDOW * (w + 1)}", words] for w, words in enumerate(heard)]
    id_col = "row_id"
    write_csv(dest / "sample_submission.csv", [id_col, *WORDS], [[r, *[1 / len(WORDS)] * len(WORDS)] for r, _ in rows])
    truth = [[r, *[int(w in words) for w in WORDS]] for r, words in rows]
    write_csv(dest / "solution.csv", [id_col, *WORDS], truth)
