"""kagtpl sounds: the audio competition the audio tests train on, spoken by Debian's espeak-ng.
The truth file must say what the recordings hold, so these read the audio back."""

from __future__ import annotations

import ast
import csv
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from kagtpl import sounds
from kagtpl.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.onecore]  # espeak-ng speaks every clip (23 s in all)


def speech_peak(segment: np.ndarray, rate: int) -> float:
    """The loudest 50 ms of `segment` in speech's band (300-4000 Hz): pink noise puts most of its
    power below it, so a window's RMS alone barely moves with a word in it."""
    spectrum = np.fft.rfft(segment)
    freqs = np.fft.rfftfreq(len(segment), 1 / rate)
    band = np.fft.irfft(np.where((freqs > 300) & (freqs < 4000), spectrum, 0), len(segment))
    frames = band[: len(band) // 1600 * 1600].reshape(-1, 1600)
    return float(np.sqrt((frames**2).mean(1)).max())


def rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sounds")
    return {layout: sounds.write_sounds(root / layout, layout, 2, 2, 3) for layout in sounds.LAYOUTS}


def test_soundscape_windows_are_row_ids_and_the_truth_is_heard(written):
    """BirdCLEF's row ids (<recording>_<end second>), a column per word in the sample; each
    soundscape is exactly its windows long at 32 kHz; within a recording, every window the truth
    gives a word is at least twice as loud in speech's band as every window it gives none."""
    data = written["folders"]
    sample, truth = rows(data / "sample_submission.csv"), rows(data.parent / "folders_solution.csv")
    assert list(sample[0]) == ["row_id", *sounds.WORDS] == list(truth[0])
    assert [r["row_id"] for r in sample] == [r["row_id"] for r in truth]
    assert [r["row_id"] for r in sample[:3]] == ["soundscape_000_5", "soundscape_000_10", "soundscape_000_15"]
    assert sorted(p.name for p in (data / "train_audio").iterdir()) == sorted(sounds.WORDS)
    assert all(len(list((data / "train_audio" / w).glob("*.ogg"))) == 2 for w in sounds.WORDS)
    checked = 0
    for k in range(2):
        audio, rate = sf.read(data / "test_soundscapes" / f"soundscape_{k:03d}.ogg", dtype="float32")
        assert rate == 32_000 and len(audio) == 3 * 5 * rate
        windows = [r for r in truth if r["row_id"].startswith(f"soundscape_{k:03d}_")]
        loudness = [speech_peak(audio[w * 5 * rate : (w + 1) * 5 * rate], rate) for w in range(3)]
        spoken = [sum(int(r[word]) for word in sounds.WORDS) > 0 for r in windows]
        if all(spoken) or not any(spoken):
            continue
        quiet = max(v for v, s in zip(loudness, spoken, strict=True) if not s)
        assert min(v for v, s in zip(loudness, spoken, strict=True) if s) > 2 * quiet, (loudness, spoken)
        checked += 1
    assert checked, "no recording with both spoken and empty windows: another seed"


def test_csv_layout_has_birdclef_metadata_with_secondary_labels(written):
    data = written["csv"]
    meta = rows(data / "train_metadata.csv")
    assert list(meta[0]) == ["primary_label", "secondary_labels", "filename", "rating"]
    assert len(meta) == 2 * len(sounds.WORDS)
    seconds = [ast.literal_eval(r["secondary_labels"]) for r in meta]
    assert any(seconds) and all(set(s) <= set(sounds.WORDS) for s in seconds)
    for row, second in zip(meta, seconds, strict=True):
        assert row["primary_label"] not in second and row["filename"].startswith(row["primary_label"] + "/")
        assert (data / "train_audio" / row["filename"]).is_file() and 1 <= int(row["rating"]) <= 5


def test_clips_layout_has_a_test_row_per_clip(written):
    data = written["clips"]
    sample = rows(data / "sample_submission.csv")
    assert [r["row_id"] for r in sample] == ["test000", "test001"]
    assert all((data / "test_audio" / f"{r['row_id']}.wav").is_file() for r in sample)
    truth = rows(data.parent / "clips_solution.csv")
    assert [sum(int(r[w]) for w in sounds.WORDS) for r in truth] == [1, 1]


def test_bad_flags_are_one_red_line_and_nothing_written(written, tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["sounds", str(tmp_path / "x"), "--layout", "midi"])
    assert bad.exit_code == 1 and bad.output.strip().splitlines() == [
        "error: --layout 'midi': one of folders, csv, clips"
    ], bad.output
    style = runner.invoke(app, ["sounds", str(tmp_path / "x"), "--style", "birds"])
    assert style.exit_code == 1 and style.output.strip().splitlines() == [
        "error: --style 'birds': one of kagtpl, unheard"
    ], style.output
    again = runner.invoke(app, ["sounds", str(written["clips"]), "--layout", "clips"])
    assert again.exit_code == 1 and "never overwrites" in again.output, again.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_unheard_style_has_other_words_and_up_to_three_in_a_window(tmp_path):
    """`--style unheard` (the audio benchmark's second set): its own eight words, disjoint from the
    default's; a test window holds 0-3 of them, and the truth is the sample's rows."""
    result = CliRunner().invoke(app, ["sounds", str(tmp_path / "u"), "--style", "unheard", "--clips", "2",
                                      "--test", "2", "--windows", "12", "--seed", "3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    words = sounds.STYLES["unheard"].words
    assert len(words) == 8 and not set(words) & set(sounds.WORDS)
    data = tmp_path / "u"
    sample, truth = rows(data / "sample_submission.csv"), rows(tmp_path / "u_solution.csv")
    assert list(sample[0]) == ["row_id", *words] == list(truth[0])
    assert [r["row_id"] for r in sample] == [r["row_id"] for r in truth] and len(truth) == 24
    heard = [sum(int(r[w]) for w in words) for r in truth]
    assert max(heard) == 3 and min(heard) == 0, heard
    assert sorted(p.name for p in (data / "train_audio").iterdir()) == sorted(words)
    audio, rate = sf.read(data / "test_soundscapes" / "soundscape_000.ogg", dtype="float32")
    assert rate == 32_000 and len(audio) == 12 * 5 * rate


def test_the_unheard_style_speaks_two_voices_only_in_the_test():
    """Its test soundscapes draw each word from the training clips' 6 utterances and 2 more in voices
    no training clip has (BirdCLEF's soundscapes are recorded elsewhere); the default's test draws
    from the training ones alone."""
    style = sounds.STYLES["unheard"]
    assert not set(style.test_voices) & set(style.voices) and not set(style.voices) & set(sounds.VOICES)
    trimmed = sounds.Style(style.words[:2], style.voices, style.test_voices, distractors=style.distractors[:1])
    spoken, in_test = sounds.voiced(np.random.default_rng(0), trimmed)
    assert sorted(spoken) == sorted([*trimmed.words, *trimmed.distractors])
    for word in trimmed.words:
        assert len(spoken[word]) == 6 and len(in_test[word]) == 8
        assert all(a is b for a, b in zip(spoken[word], in_test[word][:6], strict=True))
    plain = sounds.Style(sounds.WORDS[:2], sounds.VOICES)
    spoken, in_test = sounds.voiced(np.random.default_rng(0), plain)
    assert in_test is spoken and all(len(v) == 6 for v in spoken.values())


def test_tones_put_hum_and_insect_power_where_they_say():
    """The unheard style's background: over many draws, the hum's 50 or 60 Hz and a 2-6 kHz tone
    stand out of the spectrum; brown noise keeps no drift (its mean over a second stays near 0)."""
    rng = np.random.default_rng(1)
    found = {"hum": 0, "insect": 0}
    for _ in range(12):
        noise = sounds.tones(rng, sounds.RATE, 0.05)
        if not noise.any():
            continue
        power = np.abs(np.fft.rfft(noise)) ** 2
        freqs = np.fft.rfftfreq(len(noise), 1 / sounds.RATE)
        top = freqs[np.argmax(power)]
        found["hum"] += top in (50.0, 60.0)
        found["insect"] += 2000 <= top <= 6000
        assert abs(noise.mean()) < 0.05
    assert found["hum"] and found["insect"], found
