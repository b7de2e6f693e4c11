"""benchmarks/suite_cpu.py's reading of process accounting: the records' encoding and the kind each
process gets from its command line and its parents (the measuring itself needs root: docs/testing.md)."""

from __future__ import annotations

import importlib.util

from conftest import ROOT

spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "benchmarks" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_cpu)

PY = "/repo/.venv/bin/python"
SERVER = f"{PY} /repo/tests/forkserver.py /tmp/kagtpl-fork-x/socket"


def test_comp_t_is_a_13_bit_mantissa_and_a_base_8_exponent():
    assert [suite_cpu.comp_t(v) for v in (0, 1, 0x1FFF, 0x2001, 0x4003)] == [0, 1, 8191, 8, 192]


def test_a_record_is_read_back_with_its_cpu_in_seconds(tmp_path):
    raw = suite_cpu.RECORD.pack(0, 3, 0, 0, 0, 0, 42, 7, 1_800_000_000, 150.0, 0x2019, 5, 0, 0, 0, 0, 0, 0, b"python3")
    (tmp_path / "acct").write_bytes(raw * 2)
    recs = suite_cpu.read_records(tmp_path / "acct")
    one = {"pid": 42, "ppid": 7, "start": 1.8e9, "wall": 1.5, "cpu": 2.05, "comm": "python3", "forked": False}
    assert recs == [one] * 2
    forked = suite_cpu.RECORD.pack(suite_cpu.AFORK, 3, 0, 0, 0, 0, 43, 7, 1_800_000_000, 1.0, 1, 1, *[0] * 6, b"python")
    (tmp_path / "acct").write_bytes(forked)
    assert suite_cpu.read_records(tmp_path / "acct")[0]["forked"]  # forked and never exec'd


def test_each_process_gets_the_kind_its_command_line_and_parents_give_it():
    t = 1_800_000_000.0
    procs = [  # pid, ppid, comm, command line as /proc showed it (None: not seen; "": a zombie's)
        (10, 1, "python", f"{PY} -m pytest"),
        (11, 10, "python", f"{PY} -u -c import sys;exec(eval(sys.stdin.readline()))"),
        (12, 11, "python", SERVER),
        (13, 12, "python", SERVER),  # the monitor, forked by the server
        (14, 13, "python", SERVER),  # the script it runs (run.py here)
        (15, 14, "pt_data_worker", None),
        (16, 14, "python", f"{PY} train.py --budget=60s --start-time={t}"),
        (17, 14, "python", f"{PY} /proj/predict.py --deadline={t}"),
        (18, 16, "python", f"{PY} train.py --budget=60s --start-time={t} --device=cpu --start-time={t}"),
        (19, 11, "python", f"{PY} -m torch.distributed.run --standalone --nproc-per-node=2 train.py"),
        (20, 19, "python", f"{PY} -u train.py --parallel ddp"),
        (21, 11, "python", f"{PY} predict.py --device cpu"),
        (22, 21, "python", f"{PY} predict.py --device cpu"),  # a DataLoader worker, forked, seen
        (23, 11, "git", ""),
        (24, 11, "python", None),
        (25, 12, "python", SERVER),  # a second monitor: its script is a benchmark's
        (26, 25, "python", SERVER),
        (27, 26, "python", f"{PY} train.py --epochs 1"),  # no --start-time: not run.py's
        (28, 26, "python", f"{PY} predict.py --device cpu"),
        (29, 12, "python", SERVER),  # a third monitor: its script's command line rewritten (forkserver._set_cmdline)
        (30, 29, "python", f"{PY} train.py --device cpu"),
    ]
    warm = {13, 14, 15, 16, 22, 25, 26, 27, 29, 30}  # forked, never exec'd (acct's AFORK)
    records = [
        {"pid": p, "ppid": pp, "start": t, "wall": 1.0, "cpu": 1.0, "comm": c, "forked": p in warm}
        for p, pp, c, _ in procs
    ]
    next(r for r in records if r["pid"] == 28).pop("forked")  # recorded before the flag was kept: either
    seen = [[p, t + 0.4, cmd] for p, _, _, cmd in procs if cmd is not None]
    seen.append([16, t - 30.0, "an older process with the same pid"])
    suite_cpu.classify(records, seen)
    assert {r["pid"]: r["kind"] for r in records} == {
        10: "pytest (main)",
        11: "pytest worker (light tests, renders, in-process checks)",
        12: "fork server (its imports)",
        13: "fork server: monitor",
        14: "fork server: script run",
        15: "fork server: script run > DataLoader worker",
        16: "train.py started by run.py (warm fork)",
        17: "predict.py started by run.py (cold)",
        18: "train.py fold worker (cold)",
        19: "torchrun",
        20: "train.py DDP rank (cold)",
        21: "predict.py (cold)",
        22: "predict.py (cold) > forked child",
        23: "git (unseen)",
        24: "pytest worker (light tests, renders, in-process checks) > forked, unseen",
        25: "fork server: monitor",
        26: "fork server: script run",
        27: "train.py started by a benchmark (warm fork)",
        28: "predict.py started by a benchmark (cold or warm fork)",
        29: "fork server: monitor",
        30: "fork server: script run",
    }
