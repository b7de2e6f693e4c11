"""The one way the machinery fails: a RunError, which the scripts print as one line and exit 1.

Library code raises; only `errors.main(fn)` at the bottom of train.py, predict.py and tune
scripts turns it into a message, so a failure deep inside never leaves a traceback or a
half-written file (every write is atomic). It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import sys

# The train.py command a line that asks for a train.py run gives when its caller knows no other:
# predict.py and serve.py pass runflags.train_command, which adds the --data-dir and --out-dir they were given.
TRAIN = "python train.py"


class RunError(Exception):
    """Stops the run: printed as `ERROR: <message>` on stderr, exit code 1."""

    prefix = "ERROR"


class DataError(RunError):
    """Bad competition data; the message names the file and the row or column at fault."""

    prefix = "PREFLIGHT ERROR"


class DiskFull(RunError):
    """A write the disk (or the quota) had no room for: storage.atomic_write kept the previous file.
    room.with_room frees the run's cache and tries a submission or a fold's checkpoint once more."""


class NothingTrained(RunError):
    """predict.py found no model in the output folder (`what`: the files it looked for; `train`: the
    train.py command that writes that folder, runflags.train_command). Under run.py, with this run's
    fallback in place, the fallback stays instead (hand_in.untrained)."""

    def __init__(self, what: str, out_dir, train: str = TRAIN):
        self.what, self.out_dir = what, out_dir
        super().__init__(f"no {what} in {out_dir}: run {train} first (nothing was written)")


class Damaged(RunError):
    """A file this project wrote that does not read back: empty, cut short or not what it holds.
    Every write is atomic (a temp file, then os.replace), so something else damaged it: a full
    disk, a copy or a download stopped midway. A reader that can do without the file (an OOF set,
    a blend member, one fold's test predictions) leaves it out with a line that names it and
    `why`; elsewhere this is the script's one ERROR line."""

    def __init__(self, path, why: str):
        self.path, self.why = path, why
        super().__init__(f"{path} does not read back ({why})")


class KeptFallback(Exception):
    """predict.py's end when the run's own evidence says its checkpoints are worse than train.py's
    fallback (or there is none validated): its line on stdout, exit 0, the fallback handed in."""


class WeightsUnavailable(RunError):
    """Pretrained weights asked for but not to be had (internet off, no --weights file)."""


def weights_problem(e: Exception) -> str:
    """What a weights file that would not load holds, in words."""
    text = str(e)
    code = re.search(r"GLOBAL ([\w.]+)|Unsupported globals?: ([\w.]+)", text)
    if code:
        name = (code.group(1) or code.group(2)).rstrip(".")
        return f"a pickle that calls {name} on loading: refused, nothing of it ran (save weights as .safetensors)"
    return f"not a weights file that loads ({type(e).__name__}: {text.strip().splitlines()[-1][:100] if text.strip() else ''})"


def one_line_errors(parser) -> None:
    """argparse's own errors (a word for a number, an unknown flag) as one ERROR line and exit 1,
    like every other failure, instead of the usage block and exit 2."""

    def error(message: str):
        raise RunError(f"{message} (python {parser.prog} --help)")

    parser.error = error


# A write whose reader is gone: a pipe's (EPIPE, ECONNRESET), or a terminal that hung up (EIO: the
# SSH connection dropped; every write to it fails from then on); or whose file's disk is full
# (`nohup python run.py &` writes nohup.out beside the project, on the disk its checkpoints fill)
LOST_READER = (errno.EPIPE, errno.ECONNRESET, errno.EIO, errno.ENOSPC, errno.EDQUOT)


class Unbroken:
    """stdout or stderr that outlives its reader. A notebook cell streams run.py's lines; when the
    kernel is stopped (a container's SIGTERM to its process group), the pipe has no reader and the
    next print raises BrokenPipeError: run.py, predict.py or train.py would die with the
    submission not yet handed in. A closed terminal's next write raises EIO (OSError 5), and one to
    a file on a full disk ENOSPC: train.py died of either beside its saved folds. From the first
    lost write on, the stream's file descriptor is /dev/null (what was still buffered goes there,
    not into a failed flush at the interpreter's exit) and the run goes on (train.py's lines still
    reach train.log where its disk has room)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as e:
            if e.errno not in LOST_READER:
                raise
            self.lost()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as e:
            if e.errno not in LOST_READER:
                raise
            self.lost()

    def lost(self) -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
        except (OSError, ValueError):  # no file descriptor (a test's StringIO): nothing to redirect
            pass

    def __getattr__(self, name):  # fileno, isatty, encoding, buffer...: the stream's
        return getattr(self.stream, name)


def keep_printing() -> None:
    """sys.stdout and sys.stderr as Unbroken streams (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, Unbroken):
            setattr(sys, name, Unbroken(stream))


def main(fn, argv=None) -> None:
    """Run a script's main(); a RunError becomes its one line on stderr and exit code 1, Ctrl-C
    (KeyboardInterrupt) one STOPPED line and exit code 130, the shell's for SIGINT; argparse's
    own exits (--help 0, a usage error 2) keep their codes. Each of these ends the process at
    once (end_now), as a main() that returns does: everything is written by then."""
    keep_printing()
    try:
        fn(argv)
    except RunError as e:
        print(f"{e.prefix}: {e}", file=sys.stderr)
        end_now(1)
    except KeptFallback as e:
        print(e, flush=True)
    except KeyboardInterrupt:  # Ctrl-C before training, or twice: one line, not a traceback (every write is atomic)
        print("STOPPED: interrupted (Ctrl-C); every file written so far is whole", file=sys.stderr)
        end_now(130)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2, its lines already printed)
        if e.code is not None and not isinstance(e.code, int):  # sys.exit("message"), as the interpreter does
            print(e.code, file=sys.stderr)
        end_now(e.code if isinstance(e.code, int) else int(e.code is not None))
    end_now()


# What end_now still does before os._exit, which skips atexit and multiprocessing's finalizers: a
# folder of this process's to remove (loader_sockets.socket_dir's: every train.py and predict.py with
# loader workers left one). (pid, fn): a forked child inherits the list, and runs only what it registered.
_AT_END: list = []


def at_end_now(fn) -> None:
    """Have end_now call `fn()` (an OSError it raises is ignored) in this process, not in its forked children."""
    _AT_END.append((os.getpid(), fn))


def end_now(code: int = 0) -> None:
    """Exit with `code` without the interpreter's teardown. Every file is already whole (written
    to a temp file, then os.replace); the teardown (freeing the model, torch's threads, the
    loaders, every module) only spends time: 4-6 s after train.py's DONE line on a 2-core machine
    with two busy processes, which ran it past run.py's safety net (SIGTERM, exit -15, a failed
    run from finished work); 2.5 s after a one-line flag error with torch, torchvision, sklearn and
    the boosters imported (tests/test_bad_input.py). DataLoader workers still alive get SIGTERM
    first: they hold this process's stdout, and a caller reading it would wait for their own
    watchdog (5 s) to notice their parent gone. Then what at_end_now asked for."""
    for child in multiprocessing.active_children():
        child.terminate()
    for pid, fn in _AT_END:
        if pid == os.getpid():
            try:
                fn()
            except OSError:
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
