"""The log lines people and agents read, the JSON log and the report picture.

Every format here is an interface (kagtpl's docs/log-format.md gives each one exactly):
change a word and an agent that parses the log breaks. Pure Python, no torch. It is
machinery: `copier update` may replace it, so keep your own code in train.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from . import hardware, profiles
from .errors import RunError
from .planner import fmt_s
from .readback import last_byte


def resource_lines(cpus: int, batch: int, gpu_name: str, amp_on: bool, total_gb: float, loader: dict) -> list[str]:
    """`loader`'s note (a table's in-memory batching), else on the CPU without workers why none."""
    note = loader.get("note") or (hardware.CPU_TRAINS if gpu_name == "none" and not loader["num_workers"] else "")
    return [
        f"RESOURCES: {cpus} CPU cores, batch={batch}, GPU={gpu_name}, Mixed Precision={'ON' if amp_on else 'OFF'}",
        f"GPU Memory: {total_gb:.1f} GB" if gpu_name != "none" else "GPU Memory: none",
        f"DataLoader: num_workers={loader['num_workers']}, prefetch_factor={loader['prefetch_factor']}, "
        f"persistent_workers={loader['persistent_workers']}" + (f" ({note})" if note else ""),
    ]


def batch_line(batch: int, accum: int, why: str, world: int = 1) -> str:
    """Under DDP: `BATCH: 32 per GPU x 2 GPUs x 1 accumulation = effective batch 64 (...)`."""
    per = f"{batch} per GPU x {world} GPUs" if world > 1 else f"{batch}"
    return f"BATCH: {per} x {accum} accumulation = effective batch {batch * world * accum} ({why})"


def stopped_line(reason: str) -> str:
    return f"STOPPED: {reason}; exiting 0 so predict.py runs on the checkpoints there are"


def model_line(name: str, params_m: float) -> str:
    return f"Model: {name} ({params_m:.1f}M params, {hardware.size_class(name, params_m)} model)"


# Why a batch is what it is (machine.Batching.why's key): the engine chose it on purpose (keep it), or
# a rule or your flag set it (the seeds' check applies: under 50% of memory, double it)
KEEP = {
    "small-data": "keep it: a bigger batch leaves fewer optimizer steps an epoch, and trains worse",
    "probe": "keep it: the probe measured it",
    "oom": "keep it: a bigger batch does not fit",
}


def memory_used_lines(peak: tuple[float, float, float] | None, batch: int, why: tuple) -> list[str]:
    """After the first optimizer step: the peak memory and the VALIDATION line."""
    if peak is None:
        return ["GPU Memory Used: none (CPU run)", f"VALIDATION: CPU run, no GPU memory to check (batch_size={batch})"]
    return [
        f"GPU Memory Used: {peak[0]:.2f} GB / {peak[1]:.1f} GB ({peak[2]:.1f}%)",
        validation_line(batch, peak[2], why),
    ]


def validation_line(batch: int, pct: float, why: tuple) -> str:
    """The batch judged with its reason, `why` = (key, detail): a batch the engine chose on purpose
    (small data, the probe, an OOM) is kept whatever the memory says; one from the profile's rule
    or your flag under 50% of memory is the seeds' TOO SMALL (kagtpl doctor reads the key)."""
    key, detail = why
    verdict = KEEP.get(key, "OK")
    if key not in KEEP and pct < 50:
        verdict = f"If <50% memory, batch_size={batch} is TOO SMALL - should be {2 * batch}+"
    return f"VALIDATION: batch_size={batch}, {pct:.1f}% of GPU memory, set by {key} ({detail}): {verdict}"


def memory_drop_line(before: tuple | None, after: tuple | None) -> str | None:
    """A WARNING line when GPU memory % falls sharply between epochs (76% -> 45%)."""
    if before is None or after is None:
        return None
    text = profiles.memory_drop_warning(before[2], after[2])
    return f"WARNING: {text}" if text else None


def epoch_line(epoch: int, stats: dict, metric_name: str, gpu_field: str) -> str:
    return (
        f"Epoch {epoch}: Loss={stats['train_loss']:.4f}, ValLoss={stats['val_loss']:.4f}, "
        f"{metric_name}={stats['metric']:.4f}, LR={stats['lr']:.2e}, Time={stats['time_s']:.1f}s, "
        f"Throughput={stats['samples_per_s']:.0f} samples/s, GPU={gpu_field}"
    )


class StepProgress:
    """Progress inside an epoch, for whoever waits on it (a first epoch of a large model on a T4
    takes minutes): on a terminal, one line redrawn in place at most 10 times a second; in a log
    (a pipe, a file, a notebook, an agent) a `PROGRESS:` line every 30 s, so a long epoch is not
    silent and a fast one adds nothing. Each says steps, samples/s, the epoch's ETA and the
    running loss (read from the device only when shown: no sync per step)."""

    TTY_EVERY_S, LOG_EVERY_S = 0.1, 30.0

    def __init__(self, where: str, steps: int, clock=time.monotonic):
        self.where, self.steps, self.clock = where, steps, clock
        self.console = getattr(sys.stdout, "stream", sys.stdout)  # the terminal itself, not train.log
        self.tty = bool(getattr(self.console, "isatty", lambda: False)())
        self.t0 = self.last = clock()
        self.drawn = False

    def step(self, done: int, rows: int, loss) -> None:
        """After `done` of `steps` batches and `rows` samples; loss() gives the running loss."""
        now = self.clock()
        if now - self.last < (self.TTY_EVERY_S if self.tty else self.LOG_EVERY_S):
            return
        self.last, spent = now, now - self.t0
        eta = spent / max(done, 1) * (self.steps - done)
        text = (
            f"{self.where} step {done}/{self.steps}, {rows / max(spent, 1e-9):.0f} samples/s, "
            f"ETA {fmt_s(eta)}, loss {loss():.4f}"
        )
        if self.tty:
            self.console.write("\r\033[K" + text)
            self.console.flush()
            self.drawn = True
        else:
            print(f"PROGRESS: {text}", flush=True)

    def close(self) -> None:
        """The epoch is done: the terminal's progress line is cleared for the Epoch line."""
        if self.drawn:
            self.console.write("\r\033[K")
            self.console.flush()


class EpochLines:
    """One fold's Epoch lines, at most one a second: a table MLP's 0.1 s epochs printed 60 lines
    for a 3-second model. The fold's first epoch line is printed, then one whenever a second has
    passed since the last; a line held back is printed before anything else the fold says
    (`flush`), so the fold's last epoch is always on screen. The JSON log keeps every epoch."""

    EVERY_S = 1.0

    def __init__(self, clock=time.monotonic):
        self.clock, self.last, self.held = clock, None, None

    def show(self, line: str) -> None:
        now = self.clock()
        if self.last is None or now - self.last >= self.EVERY_S:
            print(line)
            self.last, self.held = now, None
        else:
            self.held = line

    def flush(self) -> None:
        if self.held:
            print(self.held)
            self.last, self.held = self.clock(), None


def oof_line(scores: dict[str, float], rows: int, folds: list[int], model: str | None = None) -> str:
    """The OOF line; `model` named at its end where several models of one run print theirs (tables)."""
    figures = ", ".join(f"{name}={value:.4f}" for name, value in scores.items())
    return f"OOF: {figures} over {rows} rows from folds {folds}" + (f" ({model})" if model else "")


class Tee:
    """A text stream that writes to the console (or pipe) and to the run's train.log alike. A log
    the disk has no more room for stops, with one line, and the console goes on: every later line
    (the ERROR saying which checkpoint could not be written among them) raised again, and Python
    lost stderr itself."""

    def __init__(self, stream, file):
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        self.to_file(text)  # first: a reader gone from the pipe (EPIPE) must not cost the log
        return self.stream.write(text)

    def to_file(self, text: str) -> None:
        """`text` in the log alone (a line the console already has)."""
        if not self.file.closed:
            try:
                self.file.write(text)
            except OSError as e:
                self.stop_log(e)

    def flush(self) -> None:
        if not self.file.closed:
            try:
                self.file.flush()
            except OSError as e:
                self.stop_log(e)
        self.stream.flush()

    def stop_log(self, e: OSError) -> None:
        try:
            self.file.close()  # stdout's and stderr's Tee share the file: closed, neither writes it again
        except OSError:  # the close flushes what the disk refused: refused again
            pass
        self.stream.write(f"WARNING: {self.file.name}: {e.strerror}; the rest of this log is in the console only\n")

    def __getattr__(self, name):  # fileno, isatty, encoding...: the console's
        return getattr(self.stream, name)


def log_to(path: Path) -> None:
    """From here on this process's stdout and stderr also go to `path` (train.log, written anew
    each run: `kagtpl doctor` reads it; train_log.jsonl keeps every run). Called again (tune.py's
    trials), the log moves to the new path."""
    file = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115  (line-buffered, open for the run)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, Tee):
            stream.file.close()  # a second close of a file stop_log closed does nothing
            stream = stream.stream
        setattr(sys, name, Tee(stream, file))


def keep_log(path: Path, said: str = "") -> None:
    """log_to for run.py's run.log and predict.py's predict.log: the lines that say what was handed
    in, kept where a closed terminal or a stopped notebook kernel took the console; `said`: a line
    the console already has, written first in the file (an orphan predict.py's, said before it held
    the folder). A folder that is not there is not made (predict.py on a folder nothing wrote writes
    nothing); one that refuses the file is one WARNING, and the lines stay in the console."""
    if not path.parent.is_dir():
        return
    try:
        log_to(path)
    except OSError as e:
        print(f"WARNING: {path}: {e.strerror}; this log is in the console only", flush=True)
        return
    if said:
        sys.stdout.to_file(said + "\n")


def end_line(path: Path) -> None:
    """A newline after the file's last line when it has none (an earlier run's last record cut short
    by a full disk): this run's first record starts a line of its own, not the cut one's end."""
    if last_byte(path) not in (b"", b"\n"):
        with open(path, "ab") as f:
            f.write(b"\n")


class JsonLog:
    """One JSON object per line in out_dir/train_log.jsonl, for agents and plots. Reruns append,
    so every record carries its run: `run` (start time and pid, e.g. "20261122-0712-4242") and
    `dry_run`. This run's records are also kept in `records` (the report picture is drawn from them)."""

    def __init__(self, path: Path | None, run: str, dry_run: bool):
        self.path, self.records, self.run, self.dry_run = path, [], run, dry_run  # path None: memory only
        if path is not None and Path(path).is_file():
            end_line(path)

    def write(self, **record) -> None:
        record = {"run": self.run, "dry_run": self.dry_run, **record}
        self.records.append(record)
        if self.path is None:
            return
        try:
            with open(self.path, "a") as f:  # one line, one write: fold workers append to the same file
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a full disk: the records stay in memory (the report, the experiments row)
            print(f"WARNING: {self.path}: {e.strerror}; this run's later records are kept in memory only")
            self.path = None


def read_records(path: Path, run: str) -> list[dict]:
    """One run's records back from the JSON log (what --parallel folds' workers wrote). A line that
    is not JSON (cut short by a full disk: an earlier run's, most likely) is skipped with a WARNING:
    the records draw the report and fill the experiments row, the models never read them."""
    if not Path(path).exists():
        return []
    records, torn = json_lines(Path(path).read_text(errors="replace"))
    if torn:
        print(f"WARNING: {path}: {len(torn)} line(s) not JSON (cut short?) skipped")
    return [r for r in records if r.get("run") == run]


def json_lines(text: str) -> tuple[list[dict], list[tuple[int, str]]]:
    """The JSON log's records (each line one JSON object), and each line that is not JSON as (its
    number, why): a record cut short by a kill or a full disk, the next run's starting on a line of
    its own. `kagtpl doctor` reads a log with this too (the generator loads this module)."""
    records, torn = [], []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError as e:
            torn.append((n, getattr(e, "msg", str(e))))
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, torn


def write_report(records: list[dict], path: Path, title: str) -> None:
    """The run's picture (report.py): loss, metric and GPU memory % per epoch per fold."""
    if not records:
        return
    try:
        from . import report

        print(f"REPORT: {report.plot(records, path, title)}")
    except ImportError as e:  # matplotlib is optional for training itself
        print(f"WARNING: no report picture ({e}); pip install matplotlib")
    except RunError as e:  # a full disk: a picture is not worth the run's end
        print(f"WARNING: no report picture: {e}")
