"""The CLI as a user runs it: `python -m kagtpl ...` in a subprocess. Every bad input gets
one red line on stderr, exit code 1, and nothing written: those cases are in test_bad_input.py."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml


def kagtpl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kagtpl", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def snapshot(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_new_with_data_detects_dog_breed_layout(tmp_path, digits_dir):
    r = kagtpl("new", "dog-breed", "--task", "image", "--gpu", "a10", "--data", str(digits_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    answers = yaml.safe_load((tmp_path / "dog-breed" / ".copier-answers.yml").read_text())
    # the digits are 32 px: the a10's 224 px would be 49x the compute for nothing
    assert answers["gpu"] == "a10" and answers["model"] == "efficientnet_b4" and answers["image_size"] == 32
    assert "Image size: 32 px (the training images' median side is 32 px -> 32 px" in r.stdout
    assert answers["data_dir"] == str(digits_dir)
    assert (answers["labels_csv"], answers["id_col"], answers["label_col"]) == ("labels.csv", "id", "breed")
    assert (answers["train_dir"], answers["test_dir"], answers["image_ext"]) == ("train", "test", ".jpg")
    assert answers["_src_path"].startswith("/")  # absolute: relative sources break later updates


def test_new_detects_generic_csv_layout_and_flags_override(tmp_path):
    data = tmp_path / "comp"
    (data / "train_images").mkdir(parents=True)
    (data / "test_images").mkdir()
    (data / "train.csv").write_text("image_id,label\nabc,cat\n")
    (data / "sample_submission.csv").write_text("image_id,label\nxyz,cat\n")
    (data / "train_images" / "abc.png").write_bytes(b"x")
    (data / "test_images" / "xyz.png").write_bytes(b"x")
    r = kagtpl(
        "new",
        "generic",
        "--task",
        "image",
        "--gpu",
        "l4",
        "--data",
        str(data),
        "--folds",
        "4",
        "--model",
        "resnet34",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    a = yaml.safe_load((tmp_path / "generic" / ".copier-answers.yml").read_text())
    assert (a["labels_csv"], a["id_col"], a["label_col"], a["image_ext"]) == ("train.csv", "image_id", "label", ".png")
    assert (a["train_dir"], a["test_dir"], a["folds"], a["model"]) == ("train_images", "test_images", 4, "resnet34")


def test_gpu_auto_without_nvidia_smi_is_cpu(tmp_path):
    r = kagtpl("new", "auto-proj", "--task", "image", "--gpu", "auto", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "auto-proj" / ".copier-answers.yml").read_text())["gpu"] == "cpu"


def test_gpus_and_recommend(tmp_path):
    r = kagtpl("gpus", cwd=tmp_path)
    assert r.returncode == 0 and "a100-40" in r.stdout and "7.5" in r.stdout
    r = kagtpl("recommend", "--task", "image", "--gpu", "a10", cwd=tmp_path)
    assert r.returncode == 0
    for word in (
        "batch_size",
        "128",
        "accum_steps",
        "num_workers",
        "prefetch_factor",
        "persistent_workers",
        "bf16",
        "channels_last",
    ):
        assert word in r.stdout
    r = kagtpl("recommend", "--gpu", "t4", "--image-size", "384", "--model", "efficientnet_b7", cwd=tmp_path)
    assert r.returncode == 0 and "fp16" in r.stdout and "GradScaler" in r.stdout
    assert "9h" in r.stdout and ">= 81.0 min" in r.stdout  # Kaggle profile: the 9h plan and its 15% reserve
    r = kagtpl("recommend", "--gpu", "a10", "--budget", "11m", cwd=tmp_path)
    assert ">= 1.6 min" in r.stdout and "<= 9.3 min" in r.stdout


def test_recommend_explains_the_image_size_from_the_data(tmp_path, digits_dir):
    r = kagtpl("recommend", "--task", "image", "--gpu", "a10", "--data", str(digits_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "32 px" in r.stdout and "median side is 32 px" in r.stdout  # the digits are 32 px JPEGs
    r = kagtpl("recommend", "--task", "image", "--gpu", "a10", cwd=tmp_path)
    assert "a10 profile's default" in r.stdout and "224 px" in r.stdout


def test_new_stores_the_budget(tmp_path):
    r = kagtpl("new", "timed", "--task", "image", "--gpu", "a10", "--budget", "45m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "timed" / ".copier-answers.yml").read_text())["budget"] == "45m"
    assert 'BUDGET = "45m"' in (tmp_path / "timed" / "train.py").read_text()
    assert 'BUDGET = "45m"' in (tmp_path / "timed" / "run.py").read_text()


def test_version(tmp_path):
    from kagtpl import __version__

    assert kagtpl("--version", cwd=tmp_path).stdout.strip() == f"kagtpl {__version__}"


def test_existing_non_empty_destination_needs_force(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "mine.txt").write_text("keep me")
    r = kagtpl("new", "p", "--task", "image", "--gpu", "t4", cwd=tmp_path)
    assert r.returncode == 1 and "exists and is not empty; pass --force" in r.stderr
    assert snapshot(tmp_path) == ["p", "p/mine.txt"]
    r = kagtpl("new", "p", "--task", "image", "--gpu", "t4", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p" / "mine.txt").read_text() == "keep me" and (tmp_path / "p" / "train.py").exists()


def _pty_run(args: list[str], cwd, keys: list[tuple[str, bytes]], timeout: float = 60.0) -> tuple[int, str]:
    """`python -m kagtpl ARGS` on a pseudo-terminal (a person at the keyboard): each (text, key)
    waits for `text` in the output, then types `key`. Returns (exit code, everything it printed)."""
    import os
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its terminal
        os.chdir(cwd)
        os.execv(sys.executable, [sys.executable, "-m", "kagtpl", *args])
    out, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        if keys and keys[0][0].encode() in out:
            os.write(fd, keys.pop(0)[1])
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child has closed the terminal
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_ctrl_c_at_an_interactive_question_is_one_line_and_writes_nothing(tmp_path):
    """Ctrl-C at Copier's first question printed ~1,500 characters of its answers map (the
    CopierAnswersInterrupt's text) as the error line."""
    code, out = _pty_run(["new", "comp"], tmp_path, [("competition slug", b"\x03")])
    assert code == 130, out
    assert "interrupted (Ctrl-C): nothing was written" in out, out
    assert "AnswersMap" not in out and "copier could not render" not in out, out
    after_prompt = out.split("interrupted (Ctrl-C)")[-1]
    assert len(after_prompt.strip()) < 40, out  # nothing after the one line
    assert snapshot(tmp_path) == []


def test_new_says_updates_need_git_outside_a_repository(tmp_path):
    r = kagtpl("new", "comp", "--task", "image", "--gpu", "t4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"cd {tmp_path / 'comp'} && git init && git add -A && git commit -m 'kagtpl new'" in r.stdout
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    r = kagtpl("new", "comp", "--task", "image", "--gpu", "t4", cwd=tmp_path / "repo")
    assert r.returncode == 0 and "git init" not in r.stdout, r.stdout  # already inside one: no note
    # a folder with a space: the commands printed run as written (`cd /tmp/my comps/comp` did not)
    r = kagtpl("new", "comp", "--task", "image", "--gpu", "t4", "--dest", str(tmp_path / "my comps"), cwd=tmp_path)
    command = r.stdout.split("merge into a git repository: ")[-1].strip()
    assert command.startswith(f"cd '{tmp_path / 'my comps' / 'comp'}' && git init"), r.stdout
    git = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t"}
    env = {**os.environ, **git, "GIT_COMMITTER_EMAIL": "t@t.invalid", "GIT_CONFIG_GLOBAL": os.devnull}
    subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, check=True, capture_output=True)
    made = tmp_path / "my comps" / "comp"
    log = subprocess.run(["git", "log", "--format=%s"], cwd=made, capture_output=True, text=True)
    assert log.stdout.strip() == "kagtpl new", log.stderr
