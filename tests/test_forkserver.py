"""The fork server that starts generated scripts in tests (forkserver.py) gives each the process a
`python script` would have: these compare the two, side by side, on one small script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import forkserver
import pytest

from conftest import RUN_ENV

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


def both(server, folder, *args, env=None, new_session=False):
    """The probe run as `python probe.py ARGS` and through the server: (returncode, stdout, stderr)."""
    env = {**RUN_ENV, **(env or {})}
    real = subprocess.run(
        [sys.executable, "probe.py", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        start_new_session=new_session,
    )
    forked = server.popen(["probe.py", *args], folder, env, subprocess.PIPE, new_session)
    out, err = forked.communicate(timeout=60)
    return (real.returncode, real.stdout, real.stderr), (forked.returncode, out, err)


def report(stdout: str) -> dict:
    return json.loads(stdout.splitlines()[0])


def test_a_forked_run_sees_what_python_script_would(server, probe):
    real, forked = both(server, probe, "a", "b c", env={"PROBE_VALUE": "x"}, new_session=True)
    assert real[0] == forked[0] == 0
    assert real[2] == forked[2] == "to stderr\n"
    ours, theirs = report(real[1]), report(forked[1])
    assert ours.pop("draw") != theirs.pop("draw")  # numpy's generator reseeded, as in a new process
    assert ours == theirs
    assert theirs["argv"] == ["probe.py", "a", "b c"] and theirs["path0"] == str(probe)
    assert theirs["env"] == "x" and theirs["name"] == "__main__" and theirs["sid_is_pid"]
    assert not theirs["hub"]  # the text project sets HF_HUB_OFFLINE before this is first imported
    assert real[1].splitlines()[1:] == forked[1].splitlines()[1:] == ["atexit ran"]  # a real exit


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


def test_an_image_projects_server_preloads_timm_and_leaves_the_environment_the_requests(probe):
    """The image tasks' server (conftest.launch picks it for a project with machinery/images.py):
    timm and albumentations already imported, and the script sees the request's environment, not the
    NO_ALBUMENTATIONS_UPDATE the server imported albumentations under."""
    env = {k: v for k, v in RUN_ENV.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    images = forkserver.Server(env, images=True)
    try:
        out, _ = images.popen(["probe.py"], probe, env, subprocess.PIPE, False).communicate(timeout=60)
    finally:
        images.close()
    seen = report(out)
    assert seen["timm"] and seen["hub"] and seen["albumentations_env"] is None, seen


def test_a_variable_read_at_import_gets_a_server_of_its_own():
    assert forkserver.import_env({**RUN_ENV, "OMP_NUM_THREADS": "7"}) != forkserver.import_env(RUN_ENV)
    assert forkserver.import_env({**RUN_ENV, "KAGTPL_FOLD_WORKER": "1"}) == forkserver.import_env(RUN_ENV)
