"""--compile chosen by measurement in the run, never a crash (issue 57, item 10): machinery/compiling.py.

The trial runs real torch.compile: Dynamo's tracing with the "eager" backend where the mechanism is
the subject (Inductor's C++ build costs ~20-40 s on this CPU), and Inductor itself where a compile
must fail: with no working C++ compiler (CXX=false), Inductor's codegen fails as Triton's does on a
card that cannot run it."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import RUN_ENV, run_script


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
    )


def _batches(n: int = 4, rows: int = 16) -> list:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, 12, generator=g), torch.randint(0, 3, (rows,), generator=g)) for _ in range(n)]


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y), len(y)


def _machine(m):
    return m.machine.machine_for(torch.device("cpu"), "off", {}, False)


def test_the_trial_times_compiled_steps_against_eager_ones_and_leaves_the_model_as_it_was(project_modules):
    m = project_modules
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    measure = m.compiling.trial(model, _batches(), _loss, _machine(m), 1, backend="eager")
    torch._dynamo.reset()
    assert measure.error == "", measure
    assert measure.eager_rate > 0 and measure.compiled_rate > 0 and measure.compile_s > 0, measure
    # weights and BatchNorm's running statistics as before the trial (9 forward passes in train mode
    # moved them), and no gradient left for the first optimizer step to add to
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), [
        k for k in before if not torch.equal(before[k], after[k])
    ]
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    "compiled,forced,kept,says",
    [
        (
            1200.0,
            False,
            True,
            "COMPILE: on (measured: compiled 1,200 samples/s vs eager 1,000 (+20%), compiling took 41 s)",
        ),
        (
            1030.0,
            False,
            False,
            "COMPILE: off (measured: compiled 1,030 samples/s vs eager 1,000 (+3%), compiling took 41 s: not 5% faster",
        ),
        (900.0, True, True, "COMPILE: on (--compile on; measured: compiled 900 samples/s vs eager 1,000 (-10%)"),
    ],
)
def test_compiled_is_kept_only_when_clearly_faster_unless_forced(project_modules, compiled, forced, kept, says):
    measure = project_modules.compiling.Measure(eager_rate=1000.0, compiled_rate=compiled, compile_s=41.2)
    assert measure.keep(forced) is kept
    assert measure.line(forced).startswith(says), measure.line(forced)


def test_a_compile_that_fails_trains_eager_with_a_warning(project_modules, monkeypatch, capsys):
    """Inductor with no C++ compiler: the real InductorError, raised at the first compiled step."""
    import torch._inductor.config as inductor_config

    m = project_modules
    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, "false"))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)  # no compiled graph from another test
    model = _model()
    args = SimpleNamespace(compile="on")
    kept = m.compiling.settle(model, model, _batches(), _loss, args, _machine(m), 1, True)
    out = capsys.readouterr().out
    assert kept is model and args.compile == "off"  # eager, and later folds too
    assert "WARNING: torch.compile failed in its trial (InductorError: InvalidCxxCompiler" in out, out
    assert "COMPILE: off (compiling failed: InductorError: InvalidCxxCompiler" in out, out
    assert torch._dynamo.config.suppress_errors is False
    assert all(p.grad is None for p in model.parameters())


def test_a_later_fold_follows_the_first_folds_verdict_without_a_trial(project_modules, capsys):
    m = project_modules
    model = _model()
    args = SimpleNamespace(compile="on")  # resolved by the first fold's trial
    compiled = m.compiling.settle(model, model, [], _loss, args, _machine(m), 1, False)
    assert capsys.readouterr().out == ""  # no trial, no line
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule) and compiled._orig_mod is model
    args.compile = "off"
    assert m.compiling.settle(model, model, [], _loss, args, _machine(m), 1, False) is model


@pytest.mark.slow
def test_train_py_with_compile_on_and_no_working_compiler_hands_in_eager_folds(project_modules, tmp_path):
    """End to end: `--compile on` where compiling fails used to end train.py with Inductor's
    traceback (the fallback handed in); now one WARNING, one COMPILE line, and the fold trains eager."""
    project = Path(project_modules.gpu.__file__).parents[1]
    env = {
        **RUN_ENV,
        "CXX": "false",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
    }
    out = tmp_path / "out"
    flags = ["--compile", "on", "--device", "cpu", "--no-pretrained", "--folds", "2", "--train-folds", "1"]
    r = run_script(project, "train.py", *flags, "--epochs", "1", "--no-grow", "--out-dir", str(out), env=env)
    assert "WARNING: torch.compile failed in its trial (InductorError" in r.stdout, r.stdout[-3000:]
    assert "COMPILE: off (compiling failed: InductorError" in r.stdout, r.stdout[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (out / "model_fold0.pth").stat().st_size > 0
    assert os.path.exists(out / "oof_fold0.csv") or list(out.glob("oof*")), sorted(p.name for p in out.iterdir())
