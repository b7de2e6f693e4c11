"""predict.py under run.py imports its model's library while train.py trains, not after `go`.

On an H200 machine predict.py took 10.6-12.9 s after run.py's `go` in every task (2.5-2.8 s on
these 2 cores), and an audio run's 11 s reserve handed in the fallback: the scripts import timm,
smp, torchvision's detectors and transformers where the first fold's model is built, after `go`,
and timm alone took 5 s to import there. predict.py now imports them before it waits
(prediction.start's `preload`, train.py's MODEL_LIBRARIES). Here each task's predict.py is started
cold as run.py starts it (`--after-train`): when it reads stdin for `go`, the library that its
build_model imports must be imported already, and nothing may have called CUDA.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import RUN_ENV, render

pytestmark = pytest.mark.slow

# what each task's build_model imports where it builds the model (not at the scripts' top)
BUILT_WITH = {
    "image": "timm",
    "audio": "timm",
    "segmentation": "segmentation_models_pytorch",
    "detection": "torchvision.models.detection",
    "text": "transformers.models.auto.modeling_auto",
    "tabular": "sklearn.metrics",  # the blend's metric (machinery/metrics.py imports it where it scores)
}
# predict.py as run.py starts it, whose read of `go` on stdin lists the modules imported by then, and any
# CUDA call made (the preload must not touch the card: train.py holds it until `go`), and ends it
AT_GO = """
import os, runpy, sys
import torch
cuda = []
torch.cuda._lazy_init = lambda: cuda.append("_lazy_init")
torch._C._cuda_getDeviceCount = lambda: cuda.append("_cuda_getDeviceCount") or 0
class Stdin:
    def readline(self):
        print("IMPORTED BEFORE GO:", " ".join(sorted(sys.modules)), flush=True)
        print("CUDA BEFORE GO:", cuda, flush=True)
        os._exit(0)
sys.stdin, sys.argv = Stdin(), ["predict.py", "--after-train", "--device", "cpu"]
sys.path.insert(0, os.getcwd())
runpy.run_path("predict.py", run_name="__main__")
"""


@pytest.mark.parametrize("task", sorted(BUILT_WITH))
def test_predict_imports_the_model_library_before_run_pys_go(tmp_path, task):
    project = render(tmp_path / task, task=task)
    r = subprocess.run(
        [sys.executable, "-c", AT_GO], cwd=project, env=RUN_ENV, capture_output=True, text=True, timeout=300
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("IMPORTED BEFORE GO:")), None)
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-3000:]
    assert BUILT_WITH[task] in line.split(), f"{BUILT_WITH[task]} is imported only after go"
    assert "CUDA BEFORE GO: []" in r.stdout, r.stdout[-2000:]
