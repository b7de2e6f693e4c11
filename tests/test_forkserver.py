"""The fork server that starts generated scripts in tests (forkserver.py) gives each the process a
`python script` would have: these compare the two, side by side, on one small script."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import forkserver
import pytest

from conftest import FORKSERVER, RUN_ENV, forkpython

pytestmark = [pytest.mark.slow, pytest.mark.onecore]  # real interpreters beside the fork server's, one at a time (21 s)

PROBE = """
import atexit, json, os, sys
import numpy
if sys.argv[1:2] == ["raise"]:
    raise ValueError("from the script")
if sys.argv[1:2] == ["exit"]:
    sys.exit(3)
if sys.argv[1:2] == ["wait"]:
    print("waiting", flush=True)
    __import__("time").sleep(60)
atexit.register(lambda: print("atexit ran", flush=True))
print("to stderr", file=sys.stderr)
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
    "file": __file__, "env": os.environ.get("PROBE_VALUE"), "draw": float(numpy.random.rand()),
    "hub": "huggingface_hub" in sys.modules, "sid_is_pid": os.getsid(0) == os.getpid(),
    "timm": "timm" in sys.modules, "albumentations_env": os.environ.get("NO_ALBUMENTATIONS_UPDATE"),
    "transformers": "transformers" in sys.modules, "hf_offline_env": os.environ.get("HF_HUB_OFFLINE"),
    "tmp": __import__("tempfile").gettempdir(),
}))
"""


@pytest.fixture(scope="module")
def server():
    s = forkserver.Server(RUN_ENV)
    yield s
    s.close()


@pytest.fixture()
def probe(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def both(server, folder, *args, env=None, new_session=False, script="probe.py"):
    """The script run as `python SCRIPT ARGS` and through the server: (returncode, stdout, stderr)."""
    env = {**RUN_ENV, **(env or {})}
    real = subprocess.run(
        [sys.executable, script, *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        start_new_session=new_session,
    )
    forked = server.popen([script, *args], folder, env, subprocess.PIPE, new_session)
    out, err = forked.communicate(timeout=60)
    return (real.returncode, real.stdout, real.stderr), (forked.returncode, out, err)


def report(stdout: str) -> dict:
    return json.loads(stdout.splitlines()[0])


def test_a_forked_run_sees_what_python_script_would(server, probe):
    real, forked = both(server, probe, "a", "b c", env={"PROBE_VALUE": "x", "TMPDIR": str(probe)}, new_session=True)
    assert real[0] == forked[0] == 0
    assert real[2] == forked[2] == "to stderr\n"
    ours, theirs = report(real[1]), report(forked[1])
    assert ours.pop("draw") != theirs.pop("draw")  # numpy's generator reseeded, as in a new process
    assert ours == theirs
    assert theirs["argv"] == ["probe.py", "a", "b c"] and theirs["path0"] == str(probe)
    assert theirs["env"] == "x" and theirs["name"] == "__main__" and theirs["sid_is_pid"]
    assert theirs["tmp"] == str(probe)  # the request's TMPDIR, not the server's /tmp (tempfile caches it)
    assert not theirs["hub"]  # the text project sets HF_HUB_OFFLINE before this is first imported
    assert real[1].splitlines()[1:] == forked[1].splitlines()[1:] == ["atexit ran"]  # a real exit


MOUNTED = "import os, sys; st = os.statvfs('.'); open('made', 'w').close(); "
MOUNTED += "print(st.f_blocks * st.f_frsize, os.path.ismount(os.getcwd()), os.getcwd(), 'torch' in sys.modules)"


def test_a_script_in_a_mount_namespace_of_its_own_runs_its_python_in_it(tmp_path):
    """A test's `unshare -m` script mounts a tmpfs (a full disk) and runs python there through the
    fork server (tests/forkpython.py): the runner joins the script's mount namespace, so it sees the
    mount, in its folder, as a `python` started there does, and writes into it. Such scripts ran
    cold before (the runner would have seen the server's namespace: the machine's empty folder)."""
    if not FORKSERVER or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no fork server, or no mount namespace here (unshare -m)")
    disk, env = tmp_path / "disk", forkpython(RUN_ENV, tmp_path)
    script = f'mkdir -p "{disk}" && mount -t tmpfs -o size=1m tmpfs "{disk}" && cd "{disk}" && rm -f made'
    script += f' && "$PYTHON" -c "$CODE" && rm made && "{sys.executable}" -c "$CODE" && ls'
    env["CODE"] = MOUNTED
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    forked, cold, made = r.stdout.splitlines()
    assert forked == f"1048576 True {disk} True" and cold == f"1048576 True {disk} False"  # torch: the server's
    assert made == "made" and not list(disk.iterdir())  # written on the tmpfs, which ended with the namespace


def test_exit_codes_and_tracebacks_are_those_of_python_script(server, probe):
    real, forked = both(server, probe, "exit")
    assert real[0] == forked[0] == 3
    real, forked = both(server, probe, "raise")
    assert real[0] == forked[0] == 1
    assert real[2].splitlines()[-1] == forked[2].splitlines()[-1] == "ValueError: from the script"


def test_a_signal_reaches_the_script_and_shows_in_its_returncode(server, probe):
    proc = server.popen(["probe.py", "wait"], probe, RUN_ENV, subprocess.STDOUT, True)
    assert proc.stdout.readline() == "waiting\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    os.killpg(proc.pid, signal.SIGTERM)  # its own session, as start_new_session gives
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_code_given_with_dash_c_runs_as_python_dash_c_runs_it(server, tmp_path):
    code = "import sys, json; print(json.dumps([sys.argv, sys.path[0], __name__]))"
    real = subprocess.run([sys.executable, "-c", code, "x"], cwd=tmp_path, env=RUN_ENV, capture_output=True, text=True)
    forked = server.popen(["-c", code, "x"], tmp_path, RUN_ENV, subprocess.PIPE, False)
    assert forked.communicate(timeout=60)[0] == real.stdout == '[["-c", "x"], "", "__main__"]\n'


# a task's train.py sets its kind's variables (os.environ.setdefault) before importing that kind's libraries,
# then starts fold workers with its environment: `python child.py` here
KIND_PARENT = """
import json, os, subprocess, sys
for key, value in json.loads(sys.argv[1]).items():
    os.environ.setdefault(key, value)
child = subprocess.run([sys.executable, "child.py"], input="go\\n", capture_output=True, text=True)
print(child.stdout.splitlines()[0])
"""


@pytest.mark.parametrize(("kind", "library"), [("images", "timm"), ("text", "transformers")])
def test_a_kinds_server_preloads_its_libraries_and_leaves_the_environment_the_requests(probe, parent, kind, library):
    """A task kind's server (conftest.launch picks it by the project's machinery/): its libraries
    already imported, the script sees the request's environment, not the variables the server
    imported them under; and a child of a train.py that set those variables itself, as the task's
    train.py does before its fold workers start, is forked warm (it was a new interpreter when the
    comparison left them out: the image tasks' fold workers each paid their imports)."""
    preload, kind_env, _ = forkserver.KINDS[kind]
    env = {k: v for k, v in RUN_ENV.items() if k not in kind_env}
    server = forkserver.Server(env, kind)
    (parent / "train.py").write_text(KIND_PARENT)
    try:
        out, _ = server.popen(["probe.py"], probe, env, subprocess.PIPE, False).communicate(timeout=60)
        forked = server.popen(["train.py", json.dumps(kind_env)], parent, env, subprocess.PIPE, False)
        child, err = forked.communicate(timeout=60)
    finally:
        server.close()
    seen = report(out)
    assert seen["hub"] and seen[library] and library in preload, seen
    assert seen["albumentations_env"] is None and seen["hf_offline_env"] is None, seen  # the request's environment
    assert json.loads(child)["warm"], child + err


def test_a_variable_read_at_import_gets_a_server_of_its_own():
    assert forkserver.import_env({**RUN_ENV, "OMP_NUM_THREADS": "7"}) != forkserver.import_env(RUN_ENV)
    assert forkserver.import_env({**RUN_ENV, "KAGTPL_FOLD_WORKER": "1"}) == forkserver.import_env(RUN_ENV)


# run.py's children: forked warm from it (forkserver's WARM_PARENTS), as `python child.py` would start
PARENT = """
import atexit, json, os, signal, subprocess, sys
import machinery
machinery.STATE.append("run.py's")  # the child imports machinery afresh: it sees []
signal.signal(signal.SIGTERM, lambda *a: None)  # caught here: the child starts with the default
atexit.register(lambda: print("parent's atexit", flush=True))
held = open("held.txt", "w")  # a descriptor of the parent's that the child must not hold
child = subprocess.Popen(
    [sys.executable, "child.py", *sys.argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    stderr=subprocess.PIPE, text=True, start_new_session=True,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
)
out, err = child.communicate("go\\n")
print(json.dumps({"code": child.returncode, "out": out, "err": err, "pid": os.getpid()}))
"""
CHILD = """
import atexit, json, os, signal, sys
warm = "torch" in sys.modules
import machinery
if sys.argv[1:2] == ["raise"]:
    raise ValueError("from the child")
atexit.register(lambda: print("child's atexit", flush=True))
print("to stderr", file=sys.stderr)
print(json.dumps({
    "warm": warm, "argv": sys.argv, "path0": sys.path[0], "name": __name__, "state": machinery.STATE,
    "stdin": sys.stdin.readline(), "fds": sorted(os.listdir("/proc/self/fd")),
    "sid_is_pid": os.getsid(0) == os.getpid(),
    "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").decode().split("\\0")[1:],
    "signals": [getattr(signal.getsignal(s), "name", "?") for s in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE)],
    "parent": os.getppid(),
    "stdout_tty": sys.stdout.isatty(), "unbuffered": sys.stdout.write_through,
}, default=repr))
"""


@pytest.fixture()
def parent(tmp_path):
    (tmp_path / "run.py").write_text(PARENT)
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "machinery").mkdir()
    (tmp_path / "machinery" / "__init__.py").write_text("STATE = []\n")
    return tmp_path


def test_run_pys_children_are_forked_warm_and_see_what_python_child_py_would(server, parent):
    real, forked = both(server, parent, "a", "b c", new_session=True, script="run.py")
    assert real[0] == forked[0] == 0 and real[2] == forked[2] == "", (real, forked)
    ours, theirs = (json.loads(r[1].splitlines()[0]) for r in (real, forked))
    assert real[1].splitlines()[1:] == forked[1].splitlines()[1:] == ["parent's atexit"]  # once: not the child's too
    assert ours["code"] == theirs["code"] == 0 and ours["err"] == theirs["err"] == "to stderr\n"
    mine, warm = (json.loads(r["out"].splitlines()[0]) for r in (ours, theirs))
    assert (mine.pop("warm"), warm.pop("warm")) == (False, True)  # imports paid: forked from run.py
    assert (mine.pop("parent"), warm.pop("parent")) == (ours["pid"], theirs["pid"])  # run.py's own child
    assert mine == warm, (mine, warm)
    assert warm["cmdline"] == ["child.py", "a", "b c"] and warm["state"] == [] and warm["stdin"] == "go\n"
    assert warm["fds"] == ["0", "1", "2", "3"]  # its pipes, and the listing's own: not held.txt
    assert warm["signals"] == ["SIG_DFL", "SIG_IGN", "SIG_IGN"] and warm["sid_is_pid"]  # SIGINT: its preexec_fn
    assert ours["out"].splitlines()[1:] == theirs["out"].splitlines()[1:] == ["child's atexit"]


def test_a_warm_childs_traceback_and_exit_code_are_python_child_pys(server, parent):
    real, forked = both(server, parent, "raise", script="run.py")
    ours, theirs = (json.loads(r[1].splitlines()[0]) for r in (real, forked))
    assert ours["code"] == theirs["code"] == 1
    assert ours["err"].splitlines()[-1] == theirs["err"].splitlines()[-1] == "ValueError: from the child"
    assert ours["err"].replace(sys.executable, "") == theirs["err"].replace(sys.executable, ""), theirs["err"]


OMP_PARENT = """
import json, subprocess, sys, torch
torch.ones(1 << 21).cos_()  # a parallel region of torch's threads: OpenMP's pool now lives in this process
child = subprocess.run([sys.executable, "child.py"], capture_output=True, text=True, timeout=60)
print(json.dumps({"code": child.returncode, "out": child.stdout}))
"""
OMP_CHILD = """
import sys
warm = "torch" in sys.modules
import torch
torch.ones(1 << 21).cos_()  # its own first parallel region: forked warm, it waited for the parent's threads
print(warm, torch.get_num_threads())
"""


def test_a_parent_with_an_openmp_pool_starts_its_children_as_new_interpreters(tmp_path):
    """A run.py that ran torch on 2 threads before it starts a child: the child is a new interpreter
    (forked warm, its first parallel region waited forever for threads only the parent has; seen as a
    hung predict.py under `pytest -n 0`), and it runs its own parallel region."""
    (tmp_path / "run.py").write_text(OMP_PARENT)
    (tmp_path / "child.py").write_text(OMP_CHILD)
    two = forkserver.Server({**RUN_ENV, "OMP_NUM_THREADS": "2"})
    try:
        proc = two.popen(["run.py"], tmp_path, {**RUN_ENV, "OMP_NUM_THREADS": "2"}, subprocess.PIPE, False)
        out, err = proc.communicate(timeout=120)
    finally:
        two.close()
    assert proc.returncode == 0, err[-2000:]
    child = json.loads(out.splitlines()[0])
    assert child["code"] == 0 and child["out"].split() == ["False", "2"], child


def test_a_test_blocked_past_its_limit_fails_naming_where_everything_waits():
    """conftest.time_limit, around every test: a read on a pipe that no line ever reaches (as
    start_until's on a script that hangs) is ended by SIGALRM, and the failure gives this worker's
    stacks and the machine's processes; then the test's own limit (the enclosing one) runs on."""
    import conftest

    around = signal.getsignal(signal.SIGALRM)
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # this test's own limit

    reader, writer = os.pipe()
    quiet = subprocess.Popen(["sleep", "30"], stdout=writer)
    os.close(writer)
    try:
        with pytest.raises(conftest.Hung) as hung, conftest.time_limit("the blocked test", 1):
            os.read(reader, 1)
    finally:
        quiet.kill()
        quiet.wait()
        os.close(reader)
    report = str(hung.value)
    assert report.startswith("the blocked test did not end in 1 s\n"), report[:300]
    assert "os.read(reader, 1)" in report or "test_a_test_blocked_past_its_limit" in report, report[:3000]
    assert re.search(rf"^\s*{quiet.pid} .* sleep 30$", report, re.M), report[-3000:]
    assert signal.getsignal(signal.SIGALRM) is around and signal.getitimer(signal.ITIMER_REAL)[0] > 0
