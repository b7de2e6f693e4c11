"""`kagtpl doctor`: the decision matrix on logs, our format and the field notes' (as subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kagtpl.template import hardware, profiles

LOGS = Path(__file__).parent / "logs"


def doctor(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "kagtpl", "doctor", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def log_with(tmp_path, pct, model="efficientnet_b4 (17.8M params, large model)", batch=128, workers=12, cpus=30):
    text = (
        f"RESOURCES: {cpus} CPU cores, batch={batch}, GPU=NVIDIA A10, Mixed Precision=ON\n"
        f"GPU Memory: 24.0 GB\n"
        f"DataLoader: num_workers={workers}, prefetch_factor=3, persistent_workers=True\n"
        f"Model: {model}\n"
        f"GPU Memory Used: {24 * pct / 100:.2f} GB / 24.0 GB ({pct:.1f}%)\n"
        f"Epoch 1: Loss=0.5, ValLoss=0.4, Acc=0.9, LR=1e-3, Time=10.0s, Throughput=2000 samples/s, "
        f"GPU={24 * pct / 100:.2f}GB ({pct:.1f}%)\n"
    )
    path = tmp_path / "train.log"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "pct,model,row,action,code",
    [
        (34.0, "resnet18 (11.2M params, small model)", "< 50%", "double the batch: batch 128 -> 256", 1),
        (45.0, "efficientnet_b4 (17.8M params, large model)", "< 50%", "double the batch: batch 128 -> 256", 1),
        (55.0, "resnet18 (11.2M params, small model)", "50-60%, small model", "proceed", 0),
        (
            55.0,
            "efficientnet_b4 (17.8M params, large model)",
            "50-60%, large model",
            "optionally 1.5x the batch: batch 128 -> 192",
            0,
        ),
        (65.0, "resnet18 (11.2M params, small model)", "60-70%, small model", "proceed", 0),
        (
            65.0,
            "efficientnet_b4 (17.8M params, large model)",
            "60-70%, large model",
            "proceed (below the 70% target for a large model)",
            0,
        ),
        (80.0, "resnet18 (11.2M params, small model)", "70-90%", "proceed (optimal)", 0),
        (95.0, "efficientnet_b4 (17.8M params, large model)", "> 90%", "proceed (near the limit)", 0),
    ],
)
def test_every_row_of_the_matrix(tmp_path, pct, model, row, action, code):
    r = doctor(log_with(tmp_path, pct, model))
    assert r.returncode == code, r.stdout + r.stderr
    assert f"DECISION: {row}: {action}" in r.stdout
    assert ("STATUS: ACTION NEEDED" in r.stdout) == (code == 1)


def test_field_notes_b4_at_76_percent_proceeds():
    r = doctor(LOGS / "field_notes_b4_76.log")
    assert r.returncode == 0
    assert "MODEL: EfficientNet-B4 (large model" in r.stdout
    assert "DECISION: 70-90%: proceed (optimal)" in r.stdout
    assert "MEMORY: 3 epoch lines, first 75.8%, last 76.3%, min 75.4%, max 76.3% (stable)" in r.stdout


def test_field_notes_small_cnn_at_34_percent_doubles():
    r = doctor(LOGS / "field_notes_small_cnn_34.log")
    assert r.returncode == 1
    assert "MODEL: Small CNN (small model" in r.stdout
    assert "DECISION: < 50%: double the batch: batch 256 -> 512" in r.stdout
    assert "MEMORY: 34.2% after the first step (no epoch lines yet)" in r.stdout


def test_field_notes_b4_at_51_percent_is_an_optional_1_5x():
    r = doctor(LOGS / "field_notes_b4_51.log")
    assert r.returncode == 0
    assert "DECISION: 50-60%, large model: optionally 1.5x the batch: batch 128 -> 192" in r.stdout


def test_batch_32_on_an_a100_gets_the_batch_and_the_loader_fixed():
    r = doctor(LOGS / "field_notes_batch32_a100.log", "--model", "tf_efficientnet_b4_ns")
    assert r.returncode == 1
    # 1% of memory: one step of x16 toward 70%, not six doublings
    assert "large model" in r.stdout and "grow the batch x16 toward 70% (then check again): batch 32 -> 512" in r.stdout
    assert "LOADER: num_workers=4 with 30 CPUs: use 12" in r.stdout
    assert "LOADER: prefetch_factor=2: use 3-4" in r.stdout and "persistent_workers=False" in r.stdout


def test_sharp_drop_between_epochs_is_flagged_and_json_for_agents(tmp_path):
    r = doctor(LOGS / "kagtpl_drop.log", "--json")
    assert r.returncode == 1  # 45% on a large model: double
    report = json.loads(r.stdout)
    assert report["size_class"] == "large" and report["memory_pct"] == 45.2 and report["new_batch"] == 128
    assert report["status"] == "action" and report["row"] == "< 50%"
    assert any("fell from 76.0% to 45.0%" in w for w in report["warnings"])
    assert report["loader_advice"] == []


def test_input_bound_throughput_gets_loader_advice(tmp_path):
    path = log_with(tmp_path, 80.0)
    path.write_text(path.read_text().replace("Throughput=2000", "Throughput=150"))
    r = doctor(path)
    assert r.returncode == 1 and "LOADER: 70 batches/min is below the field notes' 100/min" in r.stdout


def test_plot_is_a_real_png(tmp_path):
    png = tmp_path / "report.png"
    r = doctor(LOGS / "kagtpl_drop.log", "--plot", png)
    assert r.returncode == 1, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_errors_are_one_red_line(tmp_path):
    r = doctor(tmp_path / "missing.log")
    assert r.returncode == 1 and r.stderr.strip() == f"error: {tmp_path / 'missing.log'}: no such log file"
    empty = tmp_path / "empty.log"
    empty.write_text("hello\n")
    r = doctor(empty)
    assert r.returncode == 1 and "no GPU memory line" in r.stderr


def test_run_py_s_and_predict_py_s_logs_are_named_with_train_py_s_beside_them(tmp_path):
    """run.log and predict.log hold no training: the doctor said "no GPU memory line" of them. Now it
    names whose log it is and the train.log beside it; a console of all three scripts is read as before."""
    out = tmp_path / "output"
    out.mkdir()
    logs = {
        "run.log": "RUN: train 69.0s, predict 1.0s, total 70.0s\nRUN: handed in output/submission.csv, ...\n",
        "predict.log": "PREDICT: started beside train.py\nPRECISION: off (CPU)\nSUBMISSION: output/submission.csv\n",
    }
    for name, text in logs.items():
        (out / name).write_text(text)
        r = doctor(out / name)
        who = name.replace(".log", ".py")
        said = f"error: {out / name} is {who}'s log, not train.py's: kagtpl doctor {out / 'train.log'}"
        assert r.returncode == 1 and r.stderr.strip() == said, r.stderr
    console = tmp_path / "nohup.out"  # train.py's lines among them: the doctor reads them
    console.write_text((LOGS / "kagtpl_drop.log").read_text() + logs["predict.log"] + logs["run.log"])
    assert "STATUS: " in doctor(console).stdout


@pytest.mark.parametrize(
    "pct,size,row",
    [
        (49.9, "small", "< 50%"),
        (50.0, "small", "50-60%, small model"),
        (50.0, "large", "50-60%, large model"),
        (59.9, "large", "50-60%, large model"),
        (60.0, "large", "60-70%, large model"),
        (69.9, "small", "60-70%, small model"),
        (70.0, "large", "70-90%"),
        (90.0, "large", "70-90%"),
        (90.1, "small", "> 90%"),
    ],
)
def test_matrix_band_edges(pct, size, row):
    """Each edge of the field notes' bands falls on the side they put it."""
    assert profiles().memory_decision(pct, size).row == row


def test_memory_drop_warning_edge():
    assert profiles().memory_drop_warning(76.0, 56.0)  # a fall of exactly 20 points warns
    assert profiles().memory_drop_warning(76.0, 56.1) is None


# the line of a CPU run by the rule (machinery/hardware.py's flag_loader, written as logs.resource_lines writes it)
CPU_LOADER = f"num_workers=0, prefetch_factor=None, persistent_workers=False ({hardware().CPU_TRAINS})"


@pytest.mark.parametrize("loader", ["num_workers=1, prefetch_factor=4, persistent_workers=True", CPU_LOADER])
def test_a_cpu_log_is_read_and_said_to_have_no_gpu(tmp_path, loader):
    """...with the CPU rule's loader (no worker: the CPU trains) or --workers 1: no LOADER advice."""
    log = tmp_path / "cpu.log"
    log.write_text(
        "RESOURCES: 2 CPU cores, batch=32, GPU=none, Mixed Precision=OFF\nGPU Memory: none\n"
        f"DataLoader: {loader}\n"
        "Model: resnet18 (11.2M params, small model)\nGPU Memory Used: none (CPU run)\n"
        "Epoch 1: Loss=2.3943, ValLoss=2.3102, Acc=0.0938, LR=1.00e-03, Time=1.6s, Throughput=18 samples/s, GPU=none\n"
    )
    r = doctor(log)
    assert r.returncode == 0, r.stderr
    assert "MEMORY: CPU run: no GPU memory to check" in r.stdout and "STATUS: OK" in r.stdout
    assert "LOADER" not in r.stdout, r.stdout


def test_a_run_short_of_disk_is_an_action_naming_what_stopped_it(tmp_path):
    """The project's disk lines (caches.py, atomic_write, growth.disk_room): a run at 80% of GPU
    memory is fine by the matrix, but the disk stopped it: DISK lines, ACTION NEEDED, in JSON too."""
    log = log_with(tmp_path, 80.0, model="resnet18 (11.2M params, small model)")
    held = (
        "WARNING: output/cache/train_224px.u8: too little disk (1500.0 MB free there; this cache needs 7350.0 MB "
        "and 2048 MB stay free for checkpoints): held in memory by this process instead; free disk space there, "
        "or pass --out-dir on a larger disk"
    )
    stopped = "ERROR: output/model_fold3.pth: the disk is full (12 MB free); nothing was replaced, the previous file is"
    stopped += " intact"
    log.write_text(f"{held}\n{log.read_text()}{stopped}\n")
    r = doctor(log)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "DECISION: 70-90%: proceed (optimal)" in r.stdout
    assert f"DISK: the run was short of disk (and 1 more such line(s)): {stopped}\n" in r.stdout
    assert "DISK: free space on the disk --out-dir is on" in r.stdout and "STATUS: ACTION NEEDED" in r.stdout
    report = json.loads(doctor(log, "--json").stdout)
    assert report["status"] == "action" and stopped in report["disk"][0]
    log.write_text(log.read_text().replace(stopped, "").replace(held, ""))
    assert doctor(log).returncode == 0  # the same log without them: no DISK line, OK
    # a checkpoint the disk refused until the test set's cache gave its room (room.py): the fold saved, the disk short
    freed = "CLEANUP: the disk refused model_fold3.pth (12.0 MB free): removed the test set's cache output/cache "
    freed += "(2 file(s), 1470.0 MB; predict.py decodes it again)"
    log.write_text(f"{log.read_text()}{freed}\n")
    r = doctor(log)
    assert r.returncode == 1 and f"DISK: the run was short of disk: {freed}\n" in r.stdout, r.stdout + r.stderr


def test_a_run_that_hands_in_its_fallback_is_an_action_giving_the_verdict(tmp_path):
    """A run at 80% of GPU memory is fine by the matrix, but its folds lost to train.py's fallback on
    their OOF rows (the project's hand_in.py), so predict.py hands in the fallback: before, STATUS: OK."""
    log = log_with(tmp_path, 80.0, model="resnet18 (11.2M params, small model)")
    verdict = (
        "the folds' OOF logloss 2.3314 is worse than the training prior's 2.2822 on the same 240 rows (in 99% of 200 "
        "paired bootstrap resamples); predict.py keeps train.py's fallback (hand_in.json)"
    )
    log.write_text(f"{log.read_text()}OOF: logloss=2.3314, Acc=0.1500 over 240 rows from folds [0, 1]\n")
    assert doctor(log).returncode == 0  # the same log without the verdict: OK
    log.write_text(f"{log.read_text()}HAND-IN: the fallback: {verdict}\n")
    r = doctor(log)
    assert r.returncode == 1 and "DECISION: 70-90%: proceed (optimal)" in r.stdout, r.stdout + r.stderr
    assert f"HAND-IN: the run hands in train.py's fallback, not its folds: {verdict}\n" in r.stdout
    assert "HAND-IN: train longer (a larger run.py --budget, more --epochs)" in r.stdout
    assert r.stdout.rstrip().endswith("STATUS: ACTION NEEDED")
    report = json.loads(doctor(log, "--json").stdout)
    assert report["status"] == "action" and verdict in report["hand_in"][0]


def test_the_batch_is_the_one_the_run_ended_with(tmp_path):
    """RESOURCES says what was asked; the probe's BATCH line and an OOM's halving say what ran. An
    OOM's batch is kept: doubling it again is what ran out of memory (issue 46)."""
    log = log_with(tmp_path, 40.0, batch=128)
    text = log.read_text().replace(
        "GPU Memory: 24.0 GB\n",
        "GPU Memory: 24.0 GB\nBATCH: 64 x 2 accumulation = effective batch 128 (probe)\n"
        "OOM: batch of 64 did not fit at step 3: micro-batch 64 -> 32, accumulation 2 -> 4, effective batch 128 "
        "unchanged\n",
    )
    log.write_text(text)
    r = doctor(log)
    assert "batch 32" in r.stdout and "DECISION: < 50%: keep batch 32: set by oom (" in r.stdout, r.stdout
    assert r.returncode == 0, r.stdout


def test_no_log_given_reads_the_projects_own_or_says_where_it_looked(tmp_path):
    r = doctor(cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert "no LOG given and no output/train.log or output/train_log.jsonl here: run it in a project" in r.stderr
    (tmp_path / "exp 1").mkdir()  # a run written elsewhere (train.py --out-dir 'exp 1'): the line names its log
    (tmp_path / "exp 1" / "train.log").write_text("Model: resnet18 (11.7M params, small model)\n")
    r = doctor(cwd=tmp_path)
    assert r.returncode == 1 and "here: kagtpl doctor 'exp 1/train.log', or pass a log's path" in r.stderr, r.stderr
    (tmp_path / "output").mkdir()
    records = [{"run": "a", "fold": 0, "epoch": 1, "batch_size": 256, "gpu_pct": 80.0, "gpu_used_gb": 19.2}]
    records += [{"run": "b", "fold": 0, "epoch": e, "batch_size": 64, "gpu_pct": p} for e, p in ((1, 41.0), (2, 42.0))]
    (tmp_path / "output" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    r = doctor("--model", "resnet18", cwd=tmp_path)  # the last run's records: b's
    assert r.returncode == 1, r.stderr
    assert "MEMORY: 2 epoch lines, first 41.0%, last 42.0%" in r.stdout
    assert "MODEL: resnet18 (small model: the target is 50-60% of GPU memory)" in r.stdout
    assert "DECISION: < 50%: double the batch: batch 64 -> 128" in r.stdout


def test_a_json_log_with_a_record_cut_short_is_read_past_it_with_a_warning(tmp_path):
    """A run cut off by a full disk leaves its last record half written; the next run's records
    start on a line of their own (logs.JsonLog). The doctor refused the whole log at that line."""
    records = [{"run": "a", "fold": 0, "epoch": 1, "batch_size": 64, "gpu_pct": 41.0}]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"run": "a", "fold": 0, "ep\n'
    records = [{"run": "b", "fold": 0, "epoch": e, "batch_size": 64, "gpu_pct": 42.0} for e in (1, 2)]
    text += "".join(json.dumps(r) + "\n" for r in records)
    log = tmp_path / "train_log.jsonl"
    log.write_text(text)
    r = doctor(log, "--model", "resnet18")
    assert "MEMORY: 2 epoch lines, first 42.0%, last 42.0%" in r.stdout, r.stderr  # the last run's, b's
    assert "WARNING: 1 line(s) of the JSON log are not JSON (a record cut short by a full disk or a kill)" in r.stdout
    assert "DECISION: < 50%: double the batch: batch 64 -> 128" in r.stdout
    log.write_text("not json\n{also not\n")
    r = doctor(log)
    assert r.returncode == 1 and r.stdout == "" and "line 1 of the JSON log is not JSON" in r.stderr


def test_a_060_log_without_set_by_reads_the_reason_from_its_batch_line(tmp_path):
    """0.6.0's VALIDATION line has no `set by`: on two real H100 logs of that version the doctor
    said ACTION NEEDED and asked to grow a small-data batch x16. The BATCH line gives the reason."""
    log = log_with(tmp_path, 3.2, batch=8)
    text = log.read_text().replace(
        "GPU Memory: 24.0 GB\n",
        "GPU Memory: 24.0 GB\nBATCH: 8 x 1 accumulation = effective batch 8 (small data: 8000 training rows, at "
        "least 30 optimizer steps an epoch; lr 1.00e-03)\n",
    )
    text += "VALIDATION: If <50% memory, batch_size=8 is TOO SMALL - should be 16+\n"  # 0.6.0's line
    log.write_text(text)
    r = doctor(log)
    assert r.returncode == 0, r.stdout
    assert "keep batch 8: set by small-data (8000 training rows, at least 30 optimizer steps an epoch)" in r.stdout, (
        r.stdout
    )
    assert "STATUS: OK" in r.stdout
    # the same log without the small-data reason is still a batch to grow
    log.write_text(
        text.replace("(small data: 8000 training rows, at least 30 optimizer steps an epoch; lr 1.00e-03)", "(rule)")
    )
    assert "ACTION NEEDED" in doctor(log).stdout
