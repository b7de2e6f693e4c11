"""Start generated scripts in tests without paying for their imports each time.

A generated script spends 3-5 s of its start importing torch, pandas, sklearn and the boosters,
and the suite starts ~300 of them: on 2 cores that was a third of its time. This server imports
those libraries once; each script run is then a process of its own, forked from it:

    client (pytest) --request + stdin/stdout/stderr/status fds--> server (python forkserver.py)
    server --fork--> monitor --fork--> runner: runs `train.py ...` or `-m module ...` as __main__
    monitor: writes the runner's pid, then its exit status (-N for signal N), to the status fd

The runner is a real process: its own pid, session (start_new_session), signals and exit code,
stdout and stderr on pipes the test reads, its children (fold workers, torchrun's ranks) real
`python` processes, and its exit a real interpreter exit (atexit, thread joins, finalization).
What it shares with the server: modules imported before the fork (none of the project's own:
machinery and the scripts import fresh) and the hash seed. It runs in the request's cwd and
environment, with sys.path[0] and sys.argv as `python script` or `python -m module` sets them,
and its torch and numpy generators reseeded from the OS, as a new interpreter's are.

Libraries read some environment variables when imported (OMP_NUM_THREADS sizes the thread pool):
one server serves one value of those (`import_env`), so a request with other values gets a server
of its own. A task kind's libraries are preloaded only in a server of that kind (KINDS: the image
tasks' timm and albumentations, the text task's transformers), under the variables its scripts set
before they import them (the text project's HF_HUB_OFFLINE and its kin, which it must keep setting
first: test_text.py checks that in a new interpreter); the plain server preloads nothing that reads
the Hugging Face variables.

Each runner dumps every thread's stack to its stderr on SIGUSR2 (faulthandler): run_script asks for
that when a script has not ended in its time, so the failure says where it waited.

A runner's own children are warm too: when run.py starts `python train.py ...` or `python predict.py
...` (subprocess.Popen, sys.executable, a script or -m), the child is forked from run.py instead of
exec'ing a new interpreter, and does what exec and a new interpreter's start would: its pipes on 0-2
and every other descriptor closed, its session, process group and preexec_fn as asked, caught signals
back to their defaults, the parent's atexit handlers, project modules (machinery), sys.path and
warnings dropped, new std streams, the RNGs reseeded, and its command line (/proc/PID/cmdline, ps)
rewritten to `python train.py ...` in room the server's own command line keeps for it. It is run.py's
real child (waitpid, its exit code, parent-death signals, its process group). The parents: run.py,
train.py (its fold workers), tune.py (its trial workers), torchrun (its ranks, `python -u train.py`)
and the benchmarks (their run.py), and only where the child's variables read at import are the
runner's (a fake GPU's PYTHONPATH is not; torchrun's TORCHELASTIC_* are read by no library at import)
and no module the server left out (NEVER_PRELOADED) was imported since, nor an OpenMP pool of more
than one thread started (_openmp_pool: GNU OpenMP is not fork-safe); any other child is a new
interpreter as before. run.py's children alone were a quarter of the suite's CPU, each paying 3-5 s
of imports. tests/test_budget.py starts its run.py as `python run.py` on purpose: a budget that holds
with every interpreter's real start.

A request also sends its client's mount namespace (/proc/self/ns/mnt): a client in another one (a
test's `unshare -m` script, whose tmpfs mounts are full disks) gets a runner that joins it first
(setns, as root, in the runner: single-threaded after its fork), so the runner sees the mounts a
`python script` started there would, where it ran cold before (~4-5 s of imports a script).
KAGTPL_TEST_FORKSERVER=0 turns it off: every script then starts as `python script`;
KAGTPL_TEST_WARM_CHILDREN=0 turns off the warm children alone.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import inspect
import io
import json
import locale
import multiprocessing
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import warnings

PRELOAD = (
    "numpy",
    "torch",
    "torchvision",
    "pandas",
    "scipy.stats",
    "sklearn.metrics",
    "sklearn.model_selection",
    "sklearn.preprocessing",
    "lightgbm",
    "xgboost",
    "catboost",
    "optuna",
    "cv2",
    "matplotlib.pyplot",  # train.py's report picture: ~0.4-1 s of import at the end of every run
)
# The image tasks' libraries (image, segmentation, detection, audio), preloaded only in a server of
# their own that serves those projects (conftest.launch): timm and albumentations import
# huggingface_hub, which reads HF_* at import, and the text project sets HF_HUB_OFFLINE before its
# first import of transformers, so no server a text project (or a benchmark) uses holds it. An image
# project sets no HF_* variable, and its train.py sets NO_ALBUMENTATIONS_UPDATE=1 before importing
# albumentations, as this server does. Measured: 1.6 s of imports (timm 0.9, albumentations 0.7) in
# each of ~200 image scripts in the suite.
IMAGE_PRELOAD = ("timm", "albumentations")  # not segmentation_models_pytorch: it makes 3 nn.ReLU at import (0.07 s)
IMAGE_ENV = {"NO_ALBUMENTATIONS_UPDATE": "1"}
# The text task's libraries, preloaded in a server of their own that serves text projects, under the
# variables machinery/texts.py sets (os.environ.setdefault) before its first import of transformers:
# the offline hub, no telemetry or progress bars, the tokenizer's threads off. A text script paid
# ~5.5 s of these imports (transformers 1.3 s, the BERT model's module and transformers' core 4.0 s:
# the suite's MiniLM), ~30 scripts a suite. The Llama and Qwen2 modules are the LLM tests' (0.05 s).
# That the project sets the variables before it imports transformers is test_text.py's cold check.
TEXT_PRELOAD = (
    "transformers",
    "transformers.models.bert.modeling_bert",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "peft",
)
TEXT_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# each kind of server: what it preloads, the variables the kind's scripts set before importing it,
# and the modules of NEVER_PRELOADED it may hold
KINDS = {
    None: ((), {}, ()),
    "images": (IMAGE_PRELOAD, IMAGE_ENV, ("huggingface_hub", *IMAGE_PRELOAD)),
    "text": (TEXT_PRELOAD, TEXT_ENV, ("huggingface_hub", "transformers")),
}
# modules that read the environment a script may change before it imports them
NEVER_PRELOADED = ("huggingface_hub", "transformers", "timm", "albumentations", "machinery")
IMPORT_ENV_PREFIXES = (
    "PYTHON",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "TORCH",
    "PYTORCH",
    "CUDA",
    "NVIDIA",
    "LD_",
    "HF_",
    "TRANSFORMERS",
    "MPL",
    "TIMM",
    "NO_ALBUMENTATIONS",
)


def import_env(env: dict, kind: str | None = None) -> tuple:
    """The variables a preloaded library may read at import: one server per value of these. A
    kind's server (KINDS) imported its libraries with the variables its scripts set first, where
    `env` has none of its own (os.environ.setdefault's rule)."""
    env = {**KINDS[kind][1], **env}
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)))


# --- the server (python forkserver.py SOCKET) ---------------------------------------------------


def serve(path: str, kind: str | None = None) -> dict:
    """Answer requests until killed. Returns only in a forked runner, with its request. kind: a task
    kind's libraries preloaded too ("images": IMAGE_PRELOAD, "text": TEXT_PRELOAD)."""
    preload, _, allowed = KINDS[kind]
    for name in PRELOAD + preload:
        with contextlib.suppress(ImportError):
            __import__(name)
    early = [m for m in NEVER_PRELOADED if m in sys.modules and m not in allowed]
    if early:
        raise SystemExit(f"forkserver: {early} imported by the preload; scripts must import them first")
    SERVER.update(modules=set(sys.modules), path=list(sys.path), warnings=list(warnings.filters), kind=kind)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 5)
        conn.close()
        _reap()
        if os.fork() == 0:
            listener.close()
            return _monitor(json.loads(message), fds)
        for fd in fds:
            os.close(fd)


def _reap() -> None:
    """Collect the monitors that have finished (each exits when its runner has)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _monitor(request: dict, fds: list[int]) -> dict:
    stdin, stdout, stderr, status, mounts = fds
    pid = os.fork()
    if pid == 0:
        os.close(status)
        return _become_runner(request, stdin, stdout, stderr, mounts)
    for fd in (stdin, stdout, stderr, mounts):
        os.close(fd)
    os.write(status, f"{pid}\n".encode())
    _, code = os.waitpid(pid, 0)
    os.write(status, f"{os.waitstatus_to_exitcode(code)}\n".encode())
    os._exit(0)


def _join_mounts(mounts: int) -> None:
    """The client's mount namespace (`mounts`: its /proc/self/ns/mnt), when it is not this one: the
    runner then sees its mounts (a test's tmpfs full disks). setns resets the root and the working
    folder: _become_runner's chdir follows. A runner that cannot join (not root) exits 126 saying so."""
    if os.fstat(mounts).st_ino != os.stat("/proc/self/ns/mnt").st_ino:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(mounts, 0x00020000) != 0:  # CLONE_NEWNS
            why = os.strerror(ctypes.get_errno())
            os.write(2, f"forkserver: cannot join the client's mount namespace: {why}\n".encode())
            os._exit(126)
    os.close(mounts)


def _become_runner(request: dict, stdin: int, stdout: int, stderr: int, mounts: int) -> dict:
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
    for fd in {stdin, stdout, stderr} - {0, 1, 2}:
        os.close(fd)
    _join_mounts(mounts)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    _take_environ(request["env"])
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # run_script's report on a script that hangs
    # SIGHUP at its default, as a command typed at a terminal has it, though pytest (and so this server)
    # runs under `nohup`: a script that inherits an ignored SIGHUP rightly trains on through a hangup
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    _reseed()
    subprocess.Popen._execute_child = _execute_child  # its children: warm where they can be
    SERVER["import_env"] = import_env(request["env"], SERVER["kind"])  # the server's, as conftest.server_for matched it
    _set_cmdline([sys.executable, *request["argv"]])
    return request


def _take_environ(env: dict) -> None:
    """This process's environment becomes `env`, as a new interpreter's would be: TMPDIR read again
    at the next temp file (the server's imports cached /tmp in `tempfile`)."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
    multiprocessing.current_process()._config.pop("tempdir", None)  # nor multiprocessing's socket folder


def _reseed() -> None:
    """numpy's and torch's generators from the OS's entropy, as a new interpreter's start."""
    import numpy
    import torch

    numpy.random.seed()
    torch.seed()


def run(request: dict) -> None:
    """Run the request's script, module (-m) or code (-c) as __main__, as `python ARGV` would."""
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        _run_main(argv[1], "<string>")
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))  # python's rules for both
        path = os.path.abspath(argv[0])
        with open(path, "rb") as f:  # closed before it runs, as python's own reading of it is
            source = f.read()
        _run_main(source, path)


def _run_main(source, filename: str) -> None:
    """Python's own way: a new __main__ module, the code compiled under its file name."""
    main = types.ModuleType("__main__")
    if filename != "<string>":
        main.__file__ = filename
        main.__cached__ = None
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


# --- a runner's children (warm where they can be) ------------------------------------------------

SERVER: dict = {}  # what the server had at its start: modules, sys.path, warnings, variables read at import
# the parents whose children start warm: the generated scripts, benchmarks/ (each starts run.py) and
# torchrun (`python -u train.py` a rank, with variables of its own that no library reads at import)
WARM_PARENTS = ("run.py", "train.py", "tune.py", "benchmarks", "torchrun")
RANK_ENV_PREFIXES = ("TORCHELASTIC_", "TORCH_NCCL_")
_exec_child = subprocess.Popen._execute_child
_EXEC_ARGS = list(inspect.signature(_exec_child).parameters)[1:]
_kept: list = []  # what a warm child inherited and dropped: kept alive (freeing it would close its descriptors)


def _execute_child(self, *args) -> None:
    """subprocess.Popen's start of a child, in a runner: `python script ...` forked warm (see the
    module's docstring) where _warm says it can be; anything else as subprocess starts it."""
    a = dict(zip(_EXEC_ARGS, args, strict=True))
    if not _warm(a):
        return _exec_child(self, *args)
    fds = [a[k] for k in ("p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite")]
    pid = os.fork()
    if pid == 0:
        try:
            _become_child(a, *fds)
        except BaseException as e:  # noqa: BLE001 - what exec's failure would be: a message and 127
            os.write(2, f"forkserver: warm child failed to start: {e!r}\n".encode())
            os._exit(127)
        _run_as_interpreter([os.fsdecode(x) for x in a["args"][1:]])
    self.pid, self._child_created = pid, True
    self._close_pipe_fds(*fds)


def _warm(a: dict) -> bool:
    args = a["args"]
    if a["shell"] or not isinstance(args, (list, tuple)) or len(args) < 2 or not a["close_fds"]:
        return False
    if any(a[k] is not None for k in ("gid", "gids", "uid")) or a["executable"] not in (None, args[0]):
        return False
    main = sys.modules["__main__"]  # a project's script or a benchmark, not an installed module (torchrun's run.py)
    folder, name = os.path.split(os.path.abspath(getattr(main, "__file__", None) or "/"))
    parent = "" if _installed(main) else "benchmarks" if os.path.basename(folder) == "benchmarks" else name
    parent = "torchrun" if getattr(main.__spec__, "name", None) == "torch.distributed.run" else parent
    argv, cwd = _python_argv([os.fsdecode(x) for x in args[1:]])[0], a["cwd"] and os.fsdecode(a["cwd"])
    script = bool(argv) and (
        argv[0] == "-m"
        and len(argv) > 1
        or (not argv[0].startswith("-") and os.path.isfile(os.path.join(cwd or ".", argv[0])))
    )
    given = a["env"] if a["env"] is not None else os.environ
    decoded = ((os.fsdecode(k), os.fsdecode(v)) for k, v in given.items())
    env = {k: v for k, v in decoded if not k.startswith(RANK_ENV_PREFIXES)}
    return (
        parent in WARM_PARENTS
        and env.get("KAGTPL_TEST_WARM_CHILDREN", "1") != "0"
        and os.fsdecode(args[0]) == sys.executable
        and script
        and (cwd is None or os.path.isdir(cwd))
        and import_env(env, SERVER["kind"]) == SERVER["import_env"]
        and not any(m not in SERVER["modules"] and _installed(sys.modules.get(m)) for m in NEVER_PRELOADED)
        and not _openmp_pool()
    )


def _openmp_pool() -> bool:
    """Whether this process may hold an OpenMP thread pool: torch runs more than one thread and the
    process has threads beside its main one. GNU OpenMP is not fork-safe: a child forked after the
    parent's parallel region waits forever in its own first one for the parent's threads (seen:
    benchmarks/audio.py's predict.py after its in-process MFCC baseline, under `pytest -n 0`, where
    torch has 2 threads; under -n auto each worker's scripts have 1). Such a child is a new interpreter."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.get_num_threads() > 1 and len(os.listdir("/proc/self/task")) > 1


def _python_argv(argv: list[str]) -> tuple[list[str], bool]:
    """(ARGS, unbuffered): `python -u ARGS` (torchrun's ranks) is `python ARGS` with unbuffered streams."""
    unbuffered = argv[:1] == ["-u"]
    return (argv[1:] if unbuffered else argv), unbuffered


def _become_child(a: dict, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite) -> None:
    """What _posixsubprocess does between fork and exec, then what exec does to signals."""
    for fd in (p2cwrite, c2pread, errread):
        if fd != -1:
            os.close(fd)
    if c2pwrite == 0:
        c2pwrite = os.dup(c2pwrite)
    while errwrite in (0, 1):
        errwrite = os.dup(errwrite)
    for fd, target in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2)):
        if fd == target:
            os.set_inheritable(fd, True)
        elif fd != -1:
            os.dup2(fd, target)
    if a["cwd"] is not None:
        os.chdir(a["cwd"])
    if a["umask"] >= 0:
        os.umask(a["umask"])
    if a["restore_signals"]:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
    if a["start_new_session"]:
        os.setsid()
    if a.get("process_group", -1) >= 0:
        os.setpgid(0, a["process_group"])
    if a["preexec_fn"] is not None:
        a["preexec_fn"]()
    keep = sorted({0, 1, 2, *a["pass_fds"]})
    for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
        os.closerange(low + 1, high)
    for sig in signal.valid_signals():  # exec: a caught signal is back to its default, an ignored one stays
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(sig)) and sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
    if a["env"] is not None:
        _take_environ({os.fsdecode(k): os.fsdecode(v) for k, v in a["env"].items()})


def _run_as_interpreter(given: list[str]) -> None:
    """A new interpreter's start, `python ARGV` (-u: unbuffered streams), then its exit: never returns."""
    argv, unbuffered = _python_argv(given)
    gc.freeze()  # what the parent left is never collected: its files' descriptors were closed above
    atexit._clear()
    mine = [n for n, m in sys.modules.items() if n not in SERVER["modules"] and not _installed(m)]
    _kept.extend(sys.modules.pop(n) for n in mine)  # the project's modules (machinery) import afresh
    sys.path[:] = SERVER["path"]
    sys.excepthook, sys.unraisablehook = sys.__excepthook__, sys.__unraisablehook__
    threading.excepthook = threading.__excepthook__
    warnings.filters[:] = SERVER["warnings"]
    warnings._filters_mutated()
    _kept.extend((sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__))
    sys.stdin = sys.__stdin__ = _stream(0, "r")
    sys.stdout = sys.__stdout__ = _stream(1, "w", unbuffered)
    sys.stderr = sys.__stderr__ = _stream(2, "w", unbuffered)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python's own start
        signal.signal(sig, signal.SIG_IGN)
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _set_cmdline([sys.executable, *given])
    _reseed()
    code, interrupted = 0, False
    try:
        run({"argv": argv})
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        _traceback()
        code, interrupted = 130, True
    except BaseException:  # noqa: BLE001 - the interpreter's own: the traceback, exit 1
        _traceback()
        code = 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # non-daemon threads are joined, then atexit, then the streams flushed
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:  # Python ends a KeyboardInterrupt by SIGINT itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _traceback() -> None:
    """The exception being handled, as the interpreter prints it: from the script's frames on."""
    kind, value, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    sys.excepthook(kind, value.with_traceback(tb), tb)


def _installed(module) -> bool:
    """A module of the interpreter's or of site-packages (kept), not the project's (imported afresh)."""
    if module is None:
        return False
    file = getattr(module, "__file__", None)
    return file is None or os.path.abspath(file).startswith((sys.prefix, sys.base_prefix, sys.exec_prefix))


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _stream(fd: int, mode: str, unbuffered: bool = False):
    """sys.stdin/stdout/stderr as a new interpreter makes them on this descriptor (None if closed)."""
    try:
        raw = io.FileIO(fd, mode, closefd=False)
    except OSError:
        return None
    unbuffered = mode == "w" and (unbuffered or bool(os.environ.get("PYTHONUNBUFFERED")))
    buffered = raw if unbuffered else (io.BufferedWriter(raw) if mode == "w" else io.BufferedReader(raw))
    return io.TextIOWrapper(
        buffered,
        encoding=os.environ.get("PYTHONIOENCODING") or locale.getpreferredencoding(False),
        errors="backslashreplace" if fd == 2 else None,
        line_buffering=fd == 2 or raw.isatty(),
        write_through=unbuffered,
    )


def _set_cmdline(argv: list[str]) -> None:
    """/proc/PID/cmdline (what ps shows) says ARGV, written into the process's own argument area
    (the server's command line keeps room for it: Server's ROOM). Cut to fit where it is longer."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: proc(5) fields 48 and 49
    data = b"\0".join(os.fsencode(x) for x in argv)[: end - start - 1]
    import ctypes

    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


# --- the client (pytest) -------------------------------------------------------------------------


def request(path: str, argv, cwd, env: dict, stdio: tuple[int, int, int], new_session: bool) -> int:
    """Ask the server at `path` for `python ARGV` on these stdin, stdout and stderr descriptors:
    the status descriptor to read (the runner's pid, then its exit code) is returned."""
    status_r, status_w = os.pipe()
    message = {"argv": list(argv), "cwd": str(cwd), "env": dict(env), "new_session": new_session}
    mounts = os.open("/proc/self/ns/mnt", os.O_RDONLY)  # the runner joins it when it is not the server's
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(message).encode()], [*stdio, status_w, mounts])
    os.close(status_w)
    os.close(mounts)
    return status_r


ROOM = "--room=" + "." * 8192  # the server's last argument: room for its runners' command lines (_set_cmdline)


class Server:
    """One server process and its socket; `popen` starts a script through it."""

    def __init__(self, env: dict, kind: str | None = None):
        self.dir = tempfile.mkdtemp(prefix="kagtpl-fork-")
        self.path = os.path.join(self.dir, "socket")
        argv, env = [self.path, *([kind] if kind else [])], {**KINDS[kind][1], **env}
        self.process = subprocess.Popen(
            [sys.executable, __file__, *argv, ROOM],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.process.stdout.readline()
        if ready != "ready\n":
            raise RuntimeError(f"the fork server did not start (exit {self.process.wait()}): {ready!r}")

    def popen(self, argv, cwd, env, stderr, new_session: bool) -> Forked:
        """Like subprocess.Popen(text=True, stdout=PIPE) with stderr PIPE or STDOUT."""
        out_r, out_w = os.pipe()
        err_r, err_w = (None, out_w) if stderr == subprocess.STDOUT else os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        status_r = request(self.path, argv, cwd, env, (devnull, out_w, err_w), new_session)
        for fd in {devnull, out_w, err_w}:
            os.close(fd)
        return Forked(status_r, out_r, err_r)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.dir)


def _text(fd: int):
    return open(fd, encoding=locale.getpreferredencoding(False), newline=None)


class Forked:
    """The part of subprocess.Popen the tests use, for a runner the server forked."""

    def __init__(self, status: int, out: int, err: int | None):
        self._status = open(status, "rb", buffering=0)  # unbuffered: select() sees what is unread
        self.pid = int(self._status.readline())
        self.stdout = _text(out)
        self.stderr = _text(err) if err is not None else None
        self.returncode: int | None = None
        self._read: dict = {}  # stream -> the lines read so far, by one reader thread each

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._status], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            self._read_status()
        return self.returncode

    def _read_status(self) -> None:
        line = self._status.readline()
        self.returncode = int(line) if line else -signal.SIGKILL  # its monitor was killed too
        self._status.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Read stdout and stderr to their ends, then wait; TimeoutExpired past `timeout`, with what
        was read so far (a later call goes on reading, as subprocess.Popen's does)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._read:
            streams = [s for s in (self.stdout, self.stderr) if s is not None and not s.closed]
            self._read = {s: [] for s in streams}
            self._readers = [threading.Thread(target=self._read[s].extend, args=(s,), daemon=True) for s in streams]
            for reader in self._readers:
                reader.start()
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                so_far = {s: "".join(lines) for s, lines in self._read.items()}
                raise subprocess.TimeoutExpired(
                    str(self.pid), timeout, output=so_far.get(self.stdout), stderr=so_far.get(self.stderr)
                )
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        texts = {s: "".join(lines) for s, lines in self._read.items()}
        return texts.get(self.stdout, ""), texts.get(self.stderr) if self.stderr is not None else None


if __name__ == "__main__":
    run(serve(sys.argv[1], next((k for k in KINDS if k in sys.argv[2:]), None)))
