"""Audio projects (issue 28): BirdCLEF-style clips in, per-window probabilities out.

The data is real audio made offline (kagtpl sounds: espeak-ng speaks five words over pink
noise), so a project that learns nothing scores ~0.5 and one that hears the words scores well
above it on the test windows, whose truth is known."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import torch
from sklearn.metrics import roc_auc_score

from conftest import import_project, render, run_script
from kagtpl.sounds import write_sounds

# Small spectrograms (64 mels, 157 frames a window): the words are plain at that size, and a CPU
# epoch takes under a second.
FAST = ["--device", "cpu", "--n-mels", "64", "--hop", "1024", "--workers", "1"]


@pytest.fixture(scope="module")
def sounds(tmp_path_factory) -> Path:
    """The three layouts of kagtpl sounds, written once for the module."""
    root = tmp_path_factory.mktemp("sounds")
    write_sounds(root / "folders", "folders", clips_per_word=20, test=6, windows=4)
    write_sounds(root / "csv", "csv", clips_per_word=4, test=2, windows=3, seed=1)
    write_sounds(root / "clips", "clips", clips_per_word=4, test=5, seed=2)
    return root


@pytest.fixture(scope="module")
def audio_mod(tmp_path_factory):
    proj = render(tmp_path_factory.mktemp("audio-mods") / "proj", task="audio")
    return import_project(proj, ("audio", "errors")), proj


def window_auc(submission: Path, solution: Path) -> float:
    """Macro ROC-AUC of a submission against the truth of every window (labels with a positive)."""
    sub, truth = pd.read_csv(submission), pd.read_csv(solution)
    assert list(sub["row_id"]) == list(truth["row_id"])
    cols = [c for c in truth.columns[1:] if 0 < truth[c].sum() < len(truth)]
    return float(np.mean([roc_auc_score(truth[c], sub[c]) for c in cols]))


# ----------------------------------------------------------------------------- audio.py, in process


def test_mel_filterbank_puts_a_tone_in_the_band_of_its_frequency(audio_mod):
    audio = audio_mod[0].audio
    rate, n_fft = 16_000, 1024
    fb = audio.mel_filterbank(n_fft, 40, rate, 50, 8000)
    assert fb.shape == (n_fft // 2 + 1, 40) and torch.allclose(fb.sum(0), torch.ones(40), atol=1e-5)
    t = torch.arange(rate) / rate
    low, high = (audio.LogMel(rate, n_fft, 256, 40, 50, 8000)(torch.sin(2 * np.pi * f * t)[None]) for f in (300, 3000))
    assert low[0, 0].mean(1).argmax() < high[0, 0].mean(1).argmax()  # the higher tone, the higher band


def test_log_mel_stays_float32_under_fp16_autocast(audio_mod):
    """A loud tone's power spectrum (~(n_fft/2)^2 = 1e6) is past float16's 65504: a front end that
    ran under the autocast would give inf, then NaN after standardising."""
    audio = audio_mod[0].audio
    wave = torch.sin(2 * np.pi * 1000 * torch.arange(32_000) / 32_000)[None] * 0.99
    front = audio.LogMel(32_000, 2048, 512, 64, 50, 14_000)
    plain = front(wave)
    with torch.autocast("cpu", dtype=torch.float16):
        half = front(wave)
    assert half.dtype == torch.float32 and torch.isfinite(half).all() and torch.allclose(half, plain)
    with torch.autocast("cpu", dtype=torch.float16):  # what the fence keeps out: the filterbank in fp16
        power = torch.stft(wave, 2048, 512, window=front.window, return_complex=True).abs().square()
        assert not torch.isfinite(torch.matmul(power.transpose(1, 2), front.fb)).all()


def test_read_audio_resamples_and_names_what_it_cannot_read(tmp_path, audio_mod):
    audio, errors = audio_mod[0].audio, audio_mod[0].errors
    tone = np.sin(np.arange(44_100) / 10).astype(np.float32) * 0.5
    for rate in (44_100, 44_101, 8_000):  # polyphase, an awkward ratio (FFT), upsampling
        sf.write(tmp_path / f"r{rate}.wav", tone[:rate], rate)
        assert abs(len(audio.read_audio(str(tmp_path / f"r{rate}.wav"), 32_000)) - 32_000) <= 1
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.float32), 32_000)
    (tmp_path / "junk.ogg").write_bytes(b"not audio at all" * 10)
    sf.write(tmp_path / "slow.wav", tone[:500], 500)
    cases = {"empty.wav": "holds no samples", "junk.ogg": "cannot be read as audio", "slow.wav": "sample rate 500 Hz"}
    for name, said in cases.items():
        with pytest.raises(errors.DataError, match=f"{re.escape(name)}: .*{said}"):
            audio.read_audio(str(tmp_path / name), 32_000)


def test_soundscape_rows_cover_every_window_and_warn_of_a_short_recording(tmp_path, audio_mod, capsys):
    audio = audio_mod[0].audio
    sf.write(tmp_path / "long.ogg", np.zeros(12 * 8000, np.float32), 8000)  # 12 s: two 5 s windows (2.4 rounds down)
    sf.write(tmp_path / "short.ogg", np.zeros(2 * 8000, np.float32), 8000)
    ids, paths, starts = audio.soundscape_rows(tmp_path, 5, [], "sample_submission.csv")
    assert ids == ["long_5", "long_10", "short_5"] and starts == [0, 5, 0]
    said = capsys.readouterr().out
    assert re.search(r"WARNING: test recording .*short\.ogg is 2\.0s long, shorter than one 5s window", said)
    ids, _, starts = audio.soundscape_rows(tmp_path / "hidden", 5, ["a_5", "a_10"], "sample_submission.csv")
    assert ids == ["a_5", "a_10"] and starts == [0, 5]  # no recording yet (BirdCLEF's public set): the sample's rows
    assert "no recording in" in capsys.readouterr().out


# ----------------------------------------------------------------------------- render and run


@pytest.mark.slow
def test_folders_layout_hears_the_words_in_every_test_window_and_resumes(tmp_path, sounds):
    """Clips labelled by folder; the test is soundscapes cut into 5 s windows. Two folds of real
    training: the OOF AUC (clips) and the test windows' macro AUC beat chance by far; a rerun
    skips both complete folds."""
    data = sounds / "folders"
    project = render(tmp_path / "birds", task="audio", data_dir=str(data), folds=2, epochs=12)
    log = run_script(project, "train.py", *FAST, "--lr", "3e-3", "--patience", "12").stdout
    oof = float(re.search(r"^OOF: cmAP=[\d.]+, AUC=([\d.]+) over 100 rows from folds \[0, 1\]$", log, re.M)[1])
    assert oof > 0.85, log[-3000:]  # chance is 0.5
    assert "DATA: 100 train clips, 5 labels, 24 test rows" in log
    predicted = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "PREDICT: 24 test rows from 6 recording(s)" in predicted
    heard = window_auc(project / "output" / "submission.csv", sounds / "folders_solution.csv")
    print(f"AUDIO: OOF AUC {oof:.3f}, test windows macro AUC {heard:.3f}")
    assert heard > 0.75
    again = run_script(project, "train.py", *FAST, "--lr", "3e-3", "--patience", "12").stdout
    assert again.count("is complete, skipping (resume)") == 2 and "Epoch 1:" not in again


@pytest.mark.slow
def test_csv_layout_reads_secondary_labels_as_soft_targets_under_fp16(tmp_path, sounds):
    """BirdCLEF's train_metadata.csv: a secondary label is a 0.5 target (the OOF files hold the
    targets); the dry run under real half precision on CPU stays finite, and predict.py writes
    every window."""
    data = sounds / "csv"
    meta = pd.read_csv(data / "train_metadata.csv")
    assert (meta["secondary_labels"] != "[]").any()
    project = render(tmp_path / "meta", task="audio", data_dir=str(data), train_csv="train_metadata.csv")
    log = run_script(project, "train.py", "--dry-run", *FAST, "--amp", "fp16").stdout
    assert re.search(r"^Epoch 1: Loss=\d+\.\d+, ValLoss=\d+\.\d+", log, re.M), log[-3000:]
    oof = pd.read_csv(project / "output" / "oof.csv")
    targets = oof[[c for c in oof.columns if c.startswith("target_")]].to_numpy()
    assert set(np.unique(targets)) == {0.0, 0.5, 1.0} and (targets == 1.0).sum(1).tolist() == [1] * len(oof)
    run_script(project, "predict.py", "--device", "cpu")
    sub, sample = pd.read_csv(project / "output" / "submission.csv"), pd.read_csv(data / "sample_submission.csv")
    assert list(sub.columns) == list(sample.columns) and list(sub["row_id"]) == list(sample["row_id"])
    assert sub.iloc[:, 1:].to_numpy().min() >= 0 and sub.iloc[:, 1:].to_numpy().max() <= 1


@pytest.mark.slow
def test_clips_layout_predicts_a_row_per_test_clip(tmp_path, sounds):
    data = sounds / "clips"
    project = render(tmp_path / "clips", task="audio", data_dir=str(data), test_dir="test_audio", test_layout="clips")
    run_script(project, "train.py", "--dry-run", *FAST)
    out = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "PREDICT: 5 test rows from 5 recording(s)" in out
    sub = pd.read_csv(project / "output" / "submission.csv")
    assert list(sub["row_id"]) == [f"test{k:03d}" for k in range(5)]


def broken(data: Path, case: str) -> str:
    """Break a copy of the competition one way; returns the file the error must name."""
    clip = data / "train_audio" / "apple" / "XC0000.ogg"
    if case == "zero-length":
        clip.unlink()
        sf.write(clip.with_suffix(".wav"), np.zeros(0, np.float32), 32_000)
        return "XC0000.wav: the file holds no samples"
    if case == "unreadable":
        clip.write_bytes(b"OggS" + b"\0" * 100)
        return "XC0000.ogg: cannot be read as audio"
    if case == "sample rate":
        clip.unlink()
        sf.write(clip.with_suffix(".wav"), np.zeros(1000, np.float32), 500)
        return "XC0000.wav: sample rate 500 Hz cannot be converted to 32000 Hz"
    (data / "train_audio" / "owl").mkdir()
    shutil.copy(clip, data / "train_audio" / "owl" / "XC0001.ogg")
    return "owl/XC0001.ogg: label 'owl' is not a column of sample_submission.csv"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["zero-length", "unreadable", "sample rate", "unknown label"])
def test_preflight_names_the_bad_clip_before_training(tmp_path, sounds, case):
    data = tmp_path / "data"
    shutil.copytree(sounds / "folders", data)
    said = broken(data, case)
    project = render(tmp_path / "bad", task="audio", data_dir=str(data))
    proc = run_script(project, "train.py", "--dry-run", *FAST, check=False)
    assert proc.returncode == 1 and said in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Epoch" not in proc.stdout and not list((project / "output").glob("model_fold*"))


@pytest.mark.parametrize("layout", ["folders", "csv"])
def test_kagtpl_new_detects_the_audio_layout(tmp_path, layout):
    import yaml

    from kagtpl.new import NewAnswers, new_project

    data = write_sounds(tmp_path / "data", layout, clips_per_word=2, test=1, windows=2)
    new_project(NewAnswers(name="birds", task="audio", gpu="cpu", data=data, dest=tmp_path))
    answers = yaml.safe_load((tmp_path / "birds" / ".copier-answers.yml").read_text())
    assert answers["train_dir"] == "train_audio" and answers["test_dir"] == "test_soundscapes"
    assert answers["test_layout"] == "windows" and answers["metric"] == "auc"
    if layout == "csv":
        assert answers["train_csv"] == "train_metadata.csv" and answers["secondary_col"] == "secondary_labels"
        assert answers["file_col"] == "filename" and answers["label_col"] == "primary_label"
    else:
        assert answers["train_csv"] == "" and "file_col" not in answers
