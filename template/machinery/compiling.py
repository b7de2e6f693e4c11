"""torch.compile kept only where it is measured faster in this run, and never a crash.

`--compile auto` used to switch compiling on for every long CUDA run by a constant measured on one
H100 (resnet50 17% faster after ~90 s), a T4 included, with no way back: an Inductor or Triton
error at the first step ended train.py and the fallback was handed in. Now the first fold a
process trains runs a trial before its first epoch (`trial`): a few eager training steps timed,
then the same steps compiled (the first of them pays the compile), and:
- compiled is kept when its steps are at least GAIN faster than eager ones (`--compile auto`),
  or whatever they measure (`--compile on`: the user's word, measured for the log);
- eager is kept, with a WARNING, when compiling or a compiled step raises (Inductor, Triton, a
  C++ compiler missing, out of memory), and with a COMPILE line when compiled is not faster.
The trial's steps are forward + backward without the optimizer step (the weights are untouched;
BatchNorm's running statistics are put back), on the fold's own first batches: variable shapes
(text's dynamic padding, detection's images) recompile inside the timed steps, so their cost is
in the measure. Later folds and grown seeds of the same process reuse the compiled code (Dynamo
caches by the forward's code, not the module: measured, a new model compiles in 0 s); each fold
worker is a process of its own and runs its own trial, so each pays, and measures, its own cost.
Once compiled is kept, Dynamo's `suppress_errors` turns a later recompile's failure (a new shape)
into eager for that frame instead of an exception.
It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import parallel
from .machine import can_compile
from .steps import batch_rows, split_batch, to_device

GAIN = 1.05  # compiled is kept when its steps are >= 5% faster: under that, a measure's noise
EAGER_STEPS = 3  # timed eager steps, after one untimed (the loader's and cuDNN's first batch)
WARM_STEPS = 1  # compiled steps after the compiling one, untimed (a recompile at the 2nd call is common)
COMPILED_STEPS = 3  # timed compiled steps


@dataclass
class Measure:
    """What the trial measured: samples/s eager and compiled, the compiling step's seconds, or the error."""

    eager_rate: float = 0.0
    compiled_rate: float = 0.0
    compile_s: float = 0.0
    error: str = ""

    def keep(self, forced: bool) -> bool:
        if self.error:
            return False
        return forced or self.compiled_rate >= GAIN * self.eager_rate

    def line(self, forced: bool) -> str:
        """The verdict's COMPILE line (the error's WARNING is printed where it happened)."""
        if self.error:
            return f"COMPILE: off (compiling failed: {self.error})"
        speed = (
            f"compiled {self.compiled_rate:,.0f} samples/s vs eager {self.eager_rate:,.0f} "
            f"({self.compiled_rate / max(self.eager_rate, 1e-9) - 1:+.0%}), compiling took {self.compile_s:.0f} s"
        )
        if forced:
            return f"COMPILE: on (--compile on; measured: {speed})"
        if self.keep(forced):
            return f"COMPILE: on (measured: {speed})"
        return f"COMPILE: off (measured: {speed}: not {GAIN - 1:.0%} faster; --compile on forces it)"


def settle(model, bare, batches, batch_loss, args, machine, parts: int, first: bool):
    """The model the fold trains: compiled or not. The process's first fold (`first`) with
    --compile on or try runs the trial on `bare` and resolves args.compile to on or off (under
    DDP every rank keeps compiled only if every rank would); later folds follow args.compile."""
    if first and args.compile in ("on", "try"):
        forced = args.compile == "on"
        ok, why = can_compile(machine.device)
        measure = trial(bare, batches, batch_loss, machine, parts) if ok else Measure(error=why)
        keep = bool(parallel.smallest(int(measure.keep(forced)), machine.device))
        if keep == measure.keep(forced):
            print(measure.line(forced))
        else:
            print("COMPILE: off (another rank's trial kept eager: every rank trains alike)")
        args.compile = "on" if keep else "off"
        torch._dynamo.config.suppress_errors = keep  # a later recompile's failure runs that frame eager
    if args.compile != "on":
        return model
    return torch.compile(model)


def trial(bare, batches, batch_loss, machine, parts: int, backend: str = "inductor") -> Measure:
    """Eager steps timed, then compiled ones (see the module's docstring); `batch_loss(model,
    batch)` is the competition's loss on a batch already on the device. The bare model's
    buffers are put back and its gradients dropped after."""
    measure = Measure()
    buffers = {name: b.detach().clone() for name, b in bare.named_buffers()}
    sample = _batches(batches, 1 + EAGER_STEPS + 1 + WARM_STEPS + COMPILED_STEPS)
    if not sample:
        measure.error = "no training batch to time"
        return measure
    step = _stepper(batch_loss, machine, parts)
    try:
        step(bare, sample[0])
        measure.eager_rate = _rate(step, bare, sample[1 : 1 + EAGER_STEPS], machine)
        compiled = torch.compile(bare, backend=backend)
        t0 = time.perf_counter()
        step(compiled, sample[1 + EAGER_STEPS])
        _sync(machine)
        measure.compile_s = time.perf_counter() - t0
        for batch in sample[2 + EAGER_STEPS : 2 + EAGER_STEPS + WARM_STEPS]:
            step(compiled, batch)
        measure.compiled_rate = _rate(step, compiled, sample[2 + EAGER_STEPS + WARM_STEPS :], machine)
    except Exception as e:  # Inductor, Triton, the C++ compiler, out of memory: eager keeps training
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        measure.error = f"{type(e).__name__}: {first_line}"
        print(f"WARNING: torch.compile failed in its trial ({measure.error}): training eager")
        torch._dynamo.reset()
    finally:
        bare.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in bare.named_buffers():
                b.copy_(buffers[name])
    return measure


def _batches(batches, n: int) -> list:
    """The first `n` batches of the fold's loader (fewer batches than n: they are used again)."""
    taken = []
    for batch in batches:
        taken.append(batch)
        if len(taken) == n:
            break
    return [taken[i % len(taken)] for i in range(n)] if taken else []


def _stepper(batch_loss, machine, parts: int):
    def step(model, batch) -> int:
        batch = to_device(batch, machine)
        piece = split_batch(batch, parts)[0] if parts > 1 else batch  # OOM recovery's micro-batch
        with machine.amp.autocast():
            loss, _ = batch_loss(model, piece)
        machine.amp.backward(loss)
        model.zero_grad(set_to_none=True)
        return batch_rows(piece)

    return step


def _rate(step, model, batches: list, machine) -> float:
    _sync(machine)
    t0, rows = time.perf_counter(), 0
    for batch in batches:
        rows += step(model, batch)
    _sync(machine)
    return rows / max(time.perf_counter() - t0, 1e-9)


def _sync(machine) -> None:
    if machine.device.type == "cuda":
        torch.cuda.synchronize(machine.device)
