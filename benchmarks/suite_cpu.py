"""Where a command's CPU time goes, process by process, e.g. the whole test suite:

    sudo python benchmarks/suite_cpu.py --json /tmp/suite.json -- env CI=true python -m pytest

The kernel's process accounting (acct(2), BSD v3 records: needs root) writes one record for every
process that exits, with its exact user and system CPU time, pid, parent and start: nothing is
sampled, so a process of 10 ms counts as much as one of 10 minutes. A thread beside it reads each
new process's command line from /proc every 0.2 s; a process too short to be seen is named by its
parent and its kernel name (`comm`). Each process gets one kind (`kind` below): a pytest worker, a
fork server of tests/forkserver.py and the scripts it forks, a cold train.py / predict.py / run.py
started with `python script`, a fold worker, a torchrun rank, a Jupyter kernel, git, PostgreSQL...

It prints the CPU-seconds of each kind, the wall time and the share of the cores the command kept
busy (/proc/stat). Accounting covers the whole machine: run it on a quiet one. A process still
running when the command ends has no record, and is not counted.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")  # struct acct_v3, linux/acct.h: 64 bytes
AHZ = 100  # the records' clock ticks a second
AFORK = 0x01  # ac_flag: the process forked and did not exec
TICKS = os.sysconf("SC_CLK_TCK")
SCRIPTS = ("train.py", "predict.py", "run.py", "tune.py", "serve.py")
FOLD_WORKER = re.compile(r"--device=\S+ --start-time=\S+$")  # workers.py: the parent's argv and these two
SERVER, MONITOR, FORKED = "fork server (its imports)", "fork server: monitor", "fork server: script run"


def comp_t(value: int) -> int:
    """acct's 16-bit float: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 7))


def boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def busy_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    user, nice, system, idle, iowait, irq, softirq = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


class Watcher(threading.Thread):
    """Every new process's command line, keyed by (pid, start in epoch seconds)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen: dict[tuple[int, float], str] = {}
        self.done = threading.Event()
        self.boot = boot_time()

    def run(self) -> None:
        alive: set[str] = set()  # pids seen in the last pass: not read again (pids are handed out in turn)
        recent: dict[str, float] = {}  # ...but for those new in it, read once more: caught between fork and exec
        while not self.done.is_set():
            now = {pid for pid in os.listdir("/proc") if pid.isdigit()}
            fresh = {}
            for pid in now - alive:
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    fresh[pid] = self.boot + int(stat[stat.rindex(")") + 2 :].split()[19]) / TICKS
                except (OSError, ValueError, IndexError):
                    continue
            for pid, start in {**recent, **fresh}.items():
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if cmd.strip():  # a zombie has none: keep what was read before
                    self.seen[(int(pid), start)] = cmd.strip()
            alive, recent = now, fresh
            time.sleep(0.2)


def read_records(path: Path) -> list[dict]:
    data = path.read_bytes()
    out = []
    for i in range(0, len(data) - RECORD.size + 1, RECORD.size):
        f = RECORD.unpack_from(data, i)
        out.append(
            {
                "pid": f[6],
                "ppid": f[7],
                "start": float(f[8]),
                "wall": f[9] / AHZ,
                "cpu": (comp_t(f[10]) + comp_t(f[11])) / AHZ,
                "comm": f[18].rstrip(b"\0").decode(errors="replace"),
                "forked": bool(f[0] & AFORK),  # forked and never exec'd: a warm fork, not a new interpreter
            }
        )
    return out


def script_of(cmd: str) -> tuple[str, str]:
    """(how python was started, the script or module) from a python command line."""
    argv = cmd.split()
    for i, arg in enumerate(argv[1:], 1):
        if arg in ("-m", "-c") and i + 1 < len(argv):
            return arg, argv[i + 1]
        if not arg.startswith("-"):
            return "script", arg
    return "", ""


def kind(rec: dict, parent: dict | None) -> str:
    cmd = rec.get("cmd") or None  # "": a zombie's, or a kernel thread's
    if rec["comm"] == "pt_data_worker" and parent and parent.get("kind"):  # torch names its loader workers
        return parent["kind"].split(" > ")[0] + " > DataLoader worker"
    if cmd is None:  # too short to be seen: what its parent was, if it was forked (same image)
        if parent and rec["comm"] == parent["comm"] and parent.get("kind"):
            return parent["kind"] + " > forked, unseen"
        return f"{rec['comm']} (unseen)"
    if "python" not in cmd.split()[0]:
        return cmd.split()[0].rsplit("/", 1)[-1]
    how, what = script_of(cmd)
    forked = parent is not None and parent.get("cmd") == cmd
    base = what.rsplit("/", 1)[-1]
    if how == "-c" and "sys.stdin.readline" in cmd:
        return "pytest worker (light tests, renders, in-process checks)"
    if how == "-m" and base == "pytest":
        return "pytest (main)"
    if parent is not None and parent.get("kind") == MONITOR:  # its command line rewritten to `python train.py ...`
        return FORKED
    if base == "forkserver.py":  # tests/forkserver.py: server -> monitor -> script run, all one image
        if not forked:
            return SERVER
        return {SERVER: MONITOR, MONITOR: FORKED}.get(parent["kind"], FORKED + " > forked child")
    if forked:
        return parent["kind"].split(" > ")[0] + " > forked child"
    if how == "-m":
        return {"torch.distributed.run": "torchrun", "ipykernel_launcher": "Jupyter kernel"}.get(base, f"-m {base}")
    if base in SCRIPTS:
        # a script forked warm by its parent (tests/forkserver.py's warm children) or a new interpreter;
        # a run recorded before the flag was kept (--from-json) cannot tell them apart
        how = {True: "warm fork", False: "cold"}.get(rec.get("forked"), "cold or warm fork")
        if "--tune-start=" in cmd:
            return f"tune.py worker ({how})"
        if FOLD_WORKER.search(cmd):
            return f"{base} fold worker ({how})"
        if parent and parent.get("kind") == "torchrun":
            return f"{base} DDP rank ({how})"
        if parent and parent.get("kind", "").startswith("run.py"):
            return f"{base} started by run.py ({how})"
        if parent and parent.get("kind", "").startswith(FORKED):
            # run.py, forked by the tests' fork server, is the script whose train.py has --start-time
            # (run.py's budget_flag); the benchmarks' scripts start theirs without it
            return f"{base} started by {'run.py' if parent.get('runs_train') else 'a benchmark'} ({how})"
        return f"{base} ({how})"
    if "/benchmarks/" in what:
        return "benchmark script (cold)"
    return f"python -c {base[:20]}" if how == "-c" else f"python {base}"


def classify(records: list[dict], seen: list[list]) -> None:
    """Each record's command line (the one seen for its pid nearest its start: acct's start is whole
    seconds, and drifts) and kind, parents first (a kind reads its parent's)."""
    cmds: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    for pid, start, cmd in seen:
        cmds[pid].append((start, cmd))
    by_pid: dict[int, list[dict]] = collections.defaultdict(list)
    for rec in records:
        # acct's start is its exit's wall clock less the monotonic time lived: over a long life it
        # drifts from /proc's (1.8 s in 2,120 s here), hence a tolerance that grows with the life
        slack = 3.0 + 0.002 * rec["wall"]
        near = [(abs(s - rec["start"]), c) for s, c in cmds.get(rec["pid"], ()) if abs(s - rec["start"]) < slack]
        rec["cmd"] = min(near)[1] if near else None
        by_pid[rec["pid"]].append(rec)

    def parent_of(rec: dict) -> dict | None:
        cands = [p for p in by_pid.get(rec["ppid"], ()) if p["start"] <= rec["start"] + 3]
        return max(cands, key=lambda p: p["start"]) if cands else None

    def kind_of(rec: dict, depth: int = 0) -> str:
        if "kind" not in rec:
            parent = parent_of(rec)
            if parent is not None and depth < 50:
                kind_of(parent, depth + 1)  # a parent's kind first: a child's reads it
            rec["kind"] = kind(rec, parent)
        return rec["kind"]

    for rec in records:  # the scripts that started a train.py with run.py's --start-time (not a fold worker)
        cmd = rec["cmd"] or ""
        if "train.py" in cmd and "--start-time=" in cmd and not FOLD_WORKER.search(cmd):
            parent = parent_of(rec)
            if parent is not None:
                parent["runs_train"] = True
    for rec in records:
        kind_of(rec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the run here (every process's record, the command lines seen)")
    ap.add_argument("--from-json", type=Path, help="print the table of a run written by --json, measuring nothing")
    ap.add_argument("--top", type=int, default=30, help="kinds to print, most CPU first")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to measure, after --")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.from_json:
        run = json.loads(args.from_json.read_text())
    elif command:
        run = measure(command)
        if args.json:  # before the table: the run is kept whatever reading it does
            args.json.write_text(json.dumps(run))
    else:
        ap.error("give the command to measure after --, or --from-json")
    report(run, args.top)
    return run["exit"]


def measure(command: list[str]) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    log = Path(tempfile.mkstemp(prefix="suite-acct-")[1])
    if libc.acct(str(log).encode()) != 0:
        sys.exit(f"process accounting could not start: {os.strerror(ctypes.get_errno())} (it needs root)")
    watcher = Watcher()
    watcher.start()
    busy0, total0 = busy_ticks()
    t0 = time.time()
    try:
        rc = subprocess.call(command)
    finally:
        libc.acct(None)
        watcher.done.set()
    wall = time.time() - t0
    busy1, total1 = busy_ticks()
    records = [r for r in read_records(log) if r["start"] >= t0 - 1]
    log.unlink()
    return {
        "exit": rc,
        "wall": wall,
        "busy": (busy1 - busy0) / max(1, total1 - total0),
        "records": records,
        "seen": [[pid, start, cmd] for (pid, start), cmd in watcher.seen.items()],
    }


def report(run: dict, top: int) -> None:
    records = run["records"]
    classify(records, run["seen"])
    cpu: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for rec in records:
        cpu[rec["kind"]] += rec["cpu"]
        count[rec["kind"]] += 1
    total = sum(cpu.values())
    print(f"\nSUITE CPU: {total:.0f} CPU-s in {len(records)} processes; wall {run['wall']:.0f} s; "
          f"cores busy {run['busy']:.2f}; exit {run['exit']}")  # fmt: skip
    print(f"{'CPU-s':>8} {'share':>6} {'procs':>6}  kind")
    for name, seconds in cpu.most_common(top):
        print(f"{seconds:8.0f} {seconds / max(total, 1e-9):6.1%} {count[name]:6d}  {name}")


if __name__ == "__main__":
    sys.exit(main())
