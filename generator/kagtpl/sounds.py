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

Two styles. `kagtpl` (the default) is the set the audio defaults were chosen on. `unheard` is made
differently, to check that they were not tuned to it (benchmarks/audio.py reports both): eight
other words, other espeak-ng voices and variants, wider speeds and pitches, and backgrounds of
mains hum, steady insect-like tones, brown noise and unlabelled speech (words that are no label),
with up to three words, which may overlap, in a test window. Two of its voices speak only in the
test soundscapes, as BirdCLEF's soundscapes are recorded where no training clip was.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kagtpl.errors import KagtplError
from kagtpl.shapes import write_csv

LAYOUTS = ("folders", "csv", "clips")
WORDS = ("apple", "river", "seven", "garden", "yellow")
RATE = 32_000  # Hz: BirdCLEF's
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-gb+m4", "en-us+f5")
WINDOW = 5  # seconds per test window, as BirdCLEF scores


@dataclass(frozen=True)
class Style:
    """How a set is spoken and what it is heard over."""

    words: tuple  # the labels
    voices: tuple  # the training clips' espeak-ng voices (voice+variant)
    test_voices: tuple = ()  # voices heard only in the test
    speeds: tuple = (110, 200)  # words a minute, drawn from [low, high)
    pitches: tuple = (20, 80)
    most_words: int = 2  # in a test window (each at its own random start: two may overlap)
    distractors: tuple = ()  # spoken in the background, no label: babble
    tones: bool = False  # mains hum, insect-like tones and brown noise in the background


STYLES = {
    "kagtpl": Style(WORDS, VOICES),
    "unheard": Style(
        words=("lemon", "thunder", "pocket", "winter", "silver", "basket", "marble", "candle"),
        voices=("en-029", "en-gb-x-rp+Annie", "en-us-nyc+Andy", "en-gb-x-gbclan+klatt", "en-029+m7", "en-us+croak"),
        test_voices=("en-gb-x-gbcwmd+f2", "en-us-nyc+Storm"),
        speeds=(90, 230),
        pitches=(10, 90),
        most_words=3,
        distractors=("paper", "music", "window"),
        tones=True,
    ),
}


def espeak() -> str:
    found = shutil.which("espeak-ng")
    if not found:
        raise KagtplError("espeak-ng is not installed: it speaks the words (Debian: apt-get install espeak-ng)")
    return found


def utterances(rng, words: tuple, per_word: int, voices: tuple, style: Style) -> dict:
    """Each word spoken `per_word` times, each with its own voice (in turn from `voices`), speed and
    pitch, at RATE: word -> list of float32 arrays (trimmed of silence, peak 1)."""
    import numpy as np
    import soundfile as sf
    from scipy.signal import resample_poly

    program, spoken = espeak(), {}
    with tempfile.TemporaryDirectory() as tmp:
        for word in words:
            spoken[word] = []
            for k in range(per_word):
                wav = Path(tmp) / f"{word}{k}.wav"
                voice = voices[(k + words.index(word)) % len(voices)]
                speed, pitch = int(rng.integers(*style.speeds)), int(rng.integers(*style.pitches))
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
    from scipy.fft import next_fast_len

    # the transform at a length of small primes, the draws cut back to `n`: at a clip's own length
    # (3-8 s of samples, often a large prime factor) the two FFTs took 40 ms a clip, half of the
    # 17 s that kagtpl sounds took for 100 clips here
    size = next_fast_len(n, real=True)
    spectrum = np.fft.rfft(rng.normal(size=n), size)
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    noise = np.fft.irfft(spectrum, size)[:n]
    return (noise * level / noise.std()).astype(np.float32)


def tones(rng, n: int, level: float):
    """What `unheard` adds under its words, each part drawn with probability 1/2: mains hum (50 or
    60 Hz and four harmonics), a steady insect-like tone of 2-6 kHz pulsing 5-30 times a second,
    and brown noise (rain, traffic); `level` the RMS of each part."""
    import numpy as np
    from scipy.signal import fftconvolve

    t, out = np.arange(n) / RATE, np.zeros(n, np.float32)
    if rng.random() < 0.5:
        f = rng.choice([50.0, 60.0])
        hum = sum(np.sin(2 * np.pi * f * h * t + rng.uniform(0, 6.3)) / h for h in range(1, 6))
        out += (hum * level / hum.std()).astype(np.float32)
    if rng.random() < 0.5:
        pulse = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(5, 30) * t)
        insect = np.sin(2 * np.pi * rng.uniform(2000, 6000) * t) * pulse
        out += (insect * level / insect.std()).astype(np.float32)
    if rng.random() < 0.5:
        brown = np.cumsum(rng.normal(size=n))
        # less its 0.1 s moving average (no drift), by FFT: np.convolve's direct sum of 3,200 taps a sample
        # took 0.13 s a clip: an `unheard` set of 40 clips took 7.4 s, now 4.6 s, its decoded audio identical
        brown -= fftconvolve(brown, np.ones(RATE // 10) / (RATE // 10), mode="same")
        out += (brown * level / brown.std()).astype(np.float32)
    return out


def background(rng, n: int, spoken: dict, style: Style):
    """`n` samples of pink noise, with `style`'s tones and 0-2 unlabelled words (babble) in it."""
    track = pink_noise(rng, n, rng.uniform(0.02, 0.06))
    if style.tones:
        track += tones(rng, n, rng.uniform(0.01, 0.04))
    babble = rng.choice(style.distractors, size=int(rng.integers(0, 3)), replace=False) if style.distractors else ()
    for word in babble:
        audio = spoken[word][int(rng.integers(len(spoken[word])))]
        place(track, audio, int(rng.integers(0, max(1, n - len(audio)))), rng.uniform(0.2, 0.5))
    return track


def place(track, audio, start: int, gain: float) -> None:
    end = min(len(track), start + len(audio))
    track[start:end] += gain * audio[: end - start]


def clip(rng, spoken: dict, word: str, second: str | None, style: Style):
    """A training clip: 3-8 s of background, `word` 2-4 times at full level, `second` once, quieter."""
    import numpy as np

    track = background(rng, int(rng.uniform(3, 8) * RATE), spoken, style)
    for _ in range(int(rng.integers(2, 5))):
        audio = spoken[word][int(rng.integers(len(spoken[word])))]
        place(track, audio, int(rng.integers(0, max(1, len(track) - len(audio)))), rng.uniform(0.4, 0.8))
    if second is not None:
        audio = spoken[second][int(rng.integers(len(spoken[second])))]
        place(track, audio, int(rng.integers(0, max(1, len(track) - len(audio)))), rng.uniform(0.15, 0.3))
    return np.clip(track, -1, 1)


def soundscape(rng, spoken: dict, style: Style, windows: int):
    """A long test recording of `windows` windows, and the words heard in each (0 to
    `style.most_words` per window, each wholly inside it)."""
    import numpy as np

    span = WINDOW * RATE
    track = background(rng, windows * span, spoken, style)
    heard = []
    for w in range(windows):
        size = int(rng.integers(0, style.most_words + 1))
        present = set(rng.choice(style.words, size=size, replace=False).tolist())
        for word in sorted(present):
            audio = spoken[word][int(rng.integers(len(spoken[word])))][: span - 1]
            place(track, audio, w * span + int(rng.integers(0, span - len(audio))), rng.uniform(0.4, 0.8))
        heard.append(present)
    return np.clip(track, -1, 1), heard


def write_sounds(
    dest: Path,
    layout: str = "folders",
    clips_per_word: int = 8,
    test: int = 3,
    windows: int = 4,
    seed: int = 0,
    style: str = "kagtpl",
) -> Path:
    """Write the competition to `dest` (and its truth to <dest>_solution.csv); returns `dest`.
    `test`: soundscapes of `windows` windows each (clips: test clips, one per row); `style`: a key
    of STYLES. Everything is checked first and written in a temporary folder moved into place whole."""
    import numpy as np

    if layout not in LAYOUTS:
        raise KagtplError(f"--layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if style not in STYLES:
        raise KagtplError(f"--style {style!r}: one of {', '.join(STYLES)}")
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
        rng = np.random.default_rng(seed)
        write_competition(staging, layout, rng, STYLES[style], clips_per_word, (test, windows))
        if dest.exists():
            dest.rmdir()  # empty: checked above
        (staging / "solution.csv").rename(solution)
        staging.chmod(0o755)  # mkdtemp makes it private
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def voiced(rng, style: Style) -> tuple[dict, dict]:
    """The utterances of the training clips (each word 6 times, distractors 4) and of the test (the
    same, and each word twice more in `style.test_voices`)."""
    spoken = utterances(rng, style.words, 6, style.voices, style)
    if style.distractors:
        spoken |= utterances(rng, style.distractors, 4, style.voices + style.test_voices, style)
    if not style.test_voices:
        return spoken, spoken
    only = utterances(rng, style.words, 2, style.test_voices, style)
    return spoken, {word: spoken[word] + only.get(word, []) for word in spoken}


def write_competition(dest: Path, layout: str, rng, style: Style, clips_per_word: int, test: tuple) -> None:
    """The files of one competition in `dest`: `test` is (soundscapes or clips, windows a soundscape)."""
    import soundfile as sf

    words, (spoken, heard_in_test) = style.words, voiced(rng, style)
    ext = ".wav" if layout == "clips" else ".ogg"
    metadata = []
    for word in words:
        (dest / "train_audio" / word).mkdir(parents=True, exist_ok=True)
        for k in range(clips_per_word):
            others = [w for w in words if w != word]
            second = str(rng.choice(others)) if layout == "csv" and rng.random() < 0.4 else None
            name = f"{word}/XC{k:04d}{ext}"
            sf.write(dest / "train_audio" / name, clip(rng, spoken, word, second, style), RATE)
            metadata.append([word, repr([second] if second else []), name, int(rng.integers(1, 6))])
    if layout == "csv":
        write_csv(dest / "train_metadata.csv", ["primary_label", "secondary_labels", "filename", "rating"], metadata)
    rows = []
    if layout == "clips":
        (dest / "test_audio").mkdir(parents=True, exist_ok=True)
        for k in range(test[0]):
            word = words[k % len(words)]
            sf.write(dest / "test_audio" / f"test{k:03d}{ext}", clip(rng, heard_in_test, word, None, style), RATE)
            rows.append([f"test{k:03d}", {word}])
    else:
        (dest / "test_soundscapes").mkdir(parents=True, exist_ok=True)
        for k in range(test[0]):
            track, heard = soundscape(rng, heard_in_test, style, test[1])
            sf.write(dest / "test_soundscapes" / f"soundscape_{k:03d}{ext}", track, RATE)
            rows += [[f"soundscape_{k:03d}_{WINDOW * (w + 1)}", said] for w, said in enumerate(heard)]
    id_col = "row_id"
    write_csv(dest / "sample_submission.csv", [id_col, *words], [[r, *[1 / len(words)] * len(words)] for r, _ in rows])
    truth = [[r, *[int(w in heard) for w in words]] for r, heard in rows]
    write_csv(dest / "solution.csv", [id_col, *words], truth)
