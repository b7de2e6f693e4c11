"""--parallel folds: one worker process per device, each this train.py started again, taking the
next fold from a queue of claim files (FoldQueue), their logs relayed with a tag per worker.
tune.py's --workers run through the same launcher. docs/parallel.md gives the rules. It is
machinery: `copier update` may replace it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import hardware, orphans, storage
from . import planner as time_planner
from .gpu import SHARE_ENV
from .parallel import RUN_ID_ENV, WORKER_ENV

TUNE_WORKER_ENV = "KAGTPL_TUNE_WORKER"  # "index/count" in a worker process tune.py started


class FoldQueue:
    """Folds handed out across processes through files in one folder: a fold is taken by creating
    its claim file (O_EXCL: exactly one process wins it), and `cap` is the plan's fold count,
    which any worker's planner may cut and none may raise (the smallest wins)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def reset(self, folds: int) -> None:
        """A new run (the parent holds the output folder's lock): no claims, the plan's folds."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for f in [
            *self.folder.glob("fold*.claim"),
            *self.folder.glob("seed*_fold*.claim"),
            *self.folder.glob("fold*.retake"),
            *self.folder.glob("curve*.json"),
            *self.folder.glob("views.*"),
        ]:
            f.unlink()
        (self.folder / "cap").write_text(str(folds))

    def add_curve(self, fold: int, curve: list[float], planned: int) -> None:
        """Fold `fold`'s val losses and the epochs it was planned for, for every worker: growth's
        evidence for more epochs is every fold's, not this worker's alone (one of T4x2's workers
        trained its seeds at 1.5x the plan on 1 of its 2 folds improving, 1 of 5 in all)."""
        text = json.dumps({"curve": [float(x) for x in curve], "planned": int(planned)})
        storage.atomic_write(self.folder / f"curve{fold}.json", lambda tmp: Path(tmp).write_text(text))

    def curves(self) -> list[tuple[list[float], int]]:
        """Every worker's folds' (val losses, planned epochs) so far (add_curve's), in fold order."""
        found = []
        for f in sorted(self.folder.glob("curve*.json"), key=lambda p: int(p.stem[5:])):
            try:
                record = json.loads(f.read_text())
                found.append(([float(x) for x in record["curve"]], int(record["planned"])))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # cut short (a full disk): that fold is no evidence
        return found

    def _create(self, name: str) -> bool:
        """Create `name` holding this process's pid, unless it exists (O_EXCL: exactly one process wins)."""
        try:
            fd = os.open(self.folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True

    def take(self, fold: int, seed_no: int = 1) -> bool:
        """Claim fold `fold` of seed `seed_no` (a grown seed's fold is a unit of its own: growth)."""
        return self._create(f"fold{fold}.claim" if seed_no == 1 else f"seed{seed_no}_fold{fold}.claim")

    def take_views(self) -> bool:
        """Claim the choice of predict.py's TTA views: one worker makes it, once every fold of the
        split is taken (growing.grow), on the folds complete by then."""
        return self._create("views.claim")

    def set_view_factor(self, factor: float) -> None:
        """The views chosen over the plan's (tta_views.grow), for every worker's reserve."""
        storage.atomic_write(self.folder / "views.json", lambda tmp: Path(tmp).write_text(json.dumps(factor)))

    def view_factor(self) -> float:
        """set_view_factor's factor, 1.0 until a worker chose (or when cut short: the plan's views' price)."""
        try:
            factor = float(json.loads((self.folder / "views.json").read_text()))
        except (OSError, ValueError, TypeError):
            return 1.0
        return factor if 1.0 <= factor < float("inf") else 1.0

    def claimed(self, fold: int) -> bool:
        """Whether a worker has taken fold `fold` of the first seed (to train, or found complete)."""
        return (self.folder / f"fold{fold}.claim").exists()

    def orphan(self, fold: int) -> int:
        """The pid of the worker that took fold `fold` and has died since (the OOM killer), else 0: a
        living worker with time left takes it again (retake) before it grows a seed; once (0 after)."""
        if (self.folder / f"fold{fold}.retake").exists():
            return 0
        try:
            text = (self.folder / f"fold{fold}.claim").read_text().strip()
        except OSError:
            return 0
        return int(text) if text.isdigit() and not storage.pid_alive(int(text)) else 0

    def retake(self, fold: int) -> bool:
        """Claim a fold whose worker died, once: exactly one living worker wins it (its retake file,
        O_EXCL), and the claim names that worker from then on (the parent counts the fold as its)."""
        if not self._create(f"fold{fold}.retake"):
            return False
        storage.atomic_write(self.folder / f"fold{fold}.claim", lambda tmp: Path(tmp).write_text(str(os.getpid())))
        return True

    def claims(self) -> dict[int, int]:
        """{fold: pid of the worker that took it}."""
        found = {}
        for f in self.folder.glob("fold*.claim"):
            text = f.read_text().strip()
            found[int(f.stem[4:])] = int(text) if text.isdigit() else -1
        return found

    def grown(self) -> int:
        """Grown seeds' folds claimed by every worker so far: predict.py ensembles them too."""
        return len(list(self.folder.glob("seed*_fold*.claim")))

    def cap(self, folds: int) -> int:
        """min(folds, the shared cap), written back; under a lock (two workers may cut at once)."""
        import fcntl

        with open(self.folder / "cap", "r+") as f:
            fcntl.lockf(f, fcntl.LOCK_EX)
            text = f.read().strip()
            shared = min(folds, int(text)) if text.isdigit() else folds
            f.seek(0)
            f.truncate()
            f.write(str(shared))
            f.flush()
            fcntl.lockf(f, fcntl.LOCK_UN)
        return shared


def visible_gpu(index: int) -> str:
    """What CUDA_VISIBLE_DEVICES must say for a worker to see this process's cuda:index. It names
    physical cards: under CUDA_VISIBLE_DEVICES=2,3 (a shared server), cuda:1 is card "3", not "1"."""
    mine = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return mine[index] if index < len(mine) else str(index)


def relay(proc: subprocess.Popen, tag: str, lock: threading.Lock) -> None:
    """Copy a child's lines to stdout with a [tag] prefix until the child ends. If the reader of
    stdout goes away (`| head`, a closed terminal), stdout becomes /dev/null (errors.Unbroken, as
    every entry script's errors.main makes it) and the copying goes on: a child whose pipe filled up (64 KB,
    seconds of epoch lines) would block in its next print, past its deadline and its SIGTERM
    (two fold workers were seen stuck for 10 minutes)."""
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[{tag}] {line}")
            sys.stdout.flush()


def run_tagged(workers: list[tuple[list[str], dict, str]], stopping, announce: str | None = None) -> list:
    """Start each (command, environment, tag) as a child that dies with this process, relay its
    lines with a [tag] prefix, send SIGTERM once to every child still running when `stopping()`
    turns true (a container stop: each saves its work), and wait for all. `announce` prints
    "{announce}: {tag} started, pid {pid}" as each starts. Returns [(process, tag)]."""
    lock, procs = threading.Lock(), []
    for cmd, env, tag in workers:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            preexec_fn=functools.partial(orphans.die_with_parent, os.getpid()),  # SIGTERM: it saves
        )
        if announce:
            print(f"{announce}: {tag} started, pid {proc.pid}", flush=True)
        thread = threading.Thread(target=relay, args=(proc, tag, lock), daemon=True)
        thread.start()
        procs.append((proc, tag, thread))
    forwarded = False
    while any(p.poll() is None for p, _, _ in procs):
        if stopping() and not forwarded:
            for p, _, _ in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            forwarded = True
        time.sleep(0.2)
    for _, _, thread in procs:
        thread.join(timeout=5)
    return [(p, tag) for p, tag, _ in procs]


def cpu_threads(k: int) -> str:
    """OMP_NUM_THREADS for one of k processes side by side: torch's threads split the machine's
    CPUs as the loader workers do (hardware.CPU_SHARE_ENV)."""
    return str(max(1, hardware.machine_cpus() // k))


def run_fold_workers(
    devices: list[str], folds: int, run_id: str, out: Path, start_time: float, planner, again: bool = False
) -> dict:
    """Start one train.py per device, relay their lines with a [gpuN] / [cpuN] prefix, forward
    SIGTERM, wait. Returns {"claims": {fold: pid}, "failed": [(tag, exit code, folds lost)],
    "cap": the plan's fold count as the workers left it}. `again`: the round after a worker died,
    for its fold: complete folds are skipped (resume), and no worker grows."""
    queue = FoldQueue(out / ".folds")
    queue.reset(folds)
    n = len(devices)
    workers = []
    for i, name in enumerate(devices):
        env = {**os.environ, WORKER_ENV: f"{i}/{n}", RUN_ID_ENV: run_id, hardware.CPU_SHARE_ENV: str(n)}
        if name == "cpu":
            env["OMP_NUM_THREADS"] = cpu_threads(n)
            flag, tag = "cpu", f"cpu{i}"
        else:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpu(int(name.split(":")[1]))
            flag, tag = "cuda", f"gpu{name.split(':')[1]}"
        # the same command line, with the worker's device and the run's start (one deadline for all)
        cmd = [sys.executable, sys.argv[0], *sys.argv[1:], f"--device={flag}", f"--start-time={start_time}"]
        cmd += ["--no-grow"] if again else []
        workers.append((cmd, env, tag))
    procs = run_tagged(workers, lambda: planner.stop_reason in time_planner.SIGNALLED, announce="PARALLEL")
    claims = queue.claims()
    failed = [
        (tag, p.returncode, sorted(k for k, pid in claims.items() if pid == p.pid)) for p, tag in procs if p.returncode
    ]
    return {"claims": claims, "failed": failed, "cap": queue.cap(folds)}


def lost_folds(result: dict, planner, complete) -> list[str]:
    """A line for each fold worker that died (not of the SIGTERM this train.py forwarded: a worker
    that exited on it saved its fold) holding a fold not `complete(k)`; `result`: run_fold_workers'.
    One that lost none (it died in a grown seed's fold, or another worker trained its fold again) is
    a WARNING: the run has every fold, and a rerun would train nothing (it ended 1, "fold(s) none lost")."""
    forwarded, lines = planner.stop_reason in time_planner.SIGNALLED, []
    for tag, code, folds in result["failed"]:
        if forwarded and code == -signal.SIGTERM:
            continue
        missing = [k for k in folds if not complete(k)]  # each a checkpoint read: only a dead worker's
        if missing:
            lines.append(f"fold worker {tag} exited {code}, fold(s) {missing} lost")
        else:
            print(
                f"WARNING: fold worker {tag} exited {code}: no fold lost (each complete, or trained again by another worker)"
            )
    return lines


# ----------------------------------------------------------------------------- tune.py's workers


def auto_tune_workers(size_class: str, device_type: str, gpus: int, memory_gb: float) -> tuple[int, str]:
    """--workers auto. The field notes' matrix: a small model leaves a GPU mostly idle between its
    steps (loading, Python, small kernels), so 2-3 trials side by side keep it busy; a large one
    fills it alone. On the CPU, one trial already uses every core."""
    if device_type != "cuda":
        return 1, "CPU: one trial at a time (a trial's threads already use every core)"
    if size_class != "small":
        return gpus, f"{size_class} model: one trial per GPU ({gpus} GPU(s)), it fills the card"
    per_gpu = 3 if memory_gb >= 24 else 2
    return per_gpu * gpus, f"small model: {per_gpu} trials per {memory_gb:.0f} GB GPU keep it busy ({gpus} GPU(s))"


def tune_worker_env(i: int, k: int, gpus: int) -> dict:
    """Worker i of k: its GPU (round robin), its share of that GPU's memory, its share of the CPUs."""
    env = {**os.environ, TUNE_WORKER_ENV: f"{i}/{k}", hardware.CPU_SHARE_ENV: str(k)}
    env["OMP_NUM_THREADS"] = cpu_threads(k)
    if gpus:
        gpu = i % gpus
        on_card = len(range(gpu, k, gpus))
        env["CUDA_VISIBLE_DEVICES"] = visible_gpu(gpu)
        env[SHARE_ENV] = f"{1 / on_card:.4f}"
    return env


def run_tune_workers(k: int, gpus: int, start: float) -> list[int]:
    """Start k copies of this tune.py as workers on the shared study, relay their lines with a
    [tuneN] prefix, forward SIGTERM (and SIGHUP's stop, unless nohup ignores it), wait. Returns their exit codes."""
    stop = {}
    hangup = [] if time_planner.under_nohup() else [signal.SIGHUP]
    for sig in (signal.SIGTERM, *hangup):
        signal.signal(sig, lambda *_: stop.update(signal=True))
    cmd = [sys.executable, sys.argv[0], *sys.argv[1:], f"--tune-start={start}"]  # one deadline for all
    procs = run_tagged([(cmd, tune_worker_env(i, k, gpus), f"tune{i}") for i in range(k)], lambda: bool(stop))
    return [p.returncode for p, _ in procs]


def this_tune_worker() -> tuple[int, int] | None:
    value = os.environ.get(TUNE_WORKER_ENV)
    return tuple(int(v) for v in value.split("/")) if value else None
