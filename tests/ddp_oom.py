"""Two DDP ranks, rank 1 alone running out of memory from its second batch on: the engine's
run_epoch must make every rank split alike and end with the weights of one process that averages
both ranks' losses. Run under torchrun with a rendered project on PYTHONPATH:

    PYTHONPATH=PROJECT AGREE=1 torchrun --standalone --nproc-per-node=2 tests/ddp_oom.py

AGREE=1 uses parallel.GradSync (the fix); AGREE=0 DDP's own all-reduce inside backward (the old
loop: the ranks' collectives stop matching and both wait until the process group's timeout,
TIMEOUT_S). DEVICE=cuda runs it with NCCL, one card per rank (benchmarks/gpu_smoke.sh)."""

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist
from machinery import engine, gpu, parallel, steps

# the engine's own way in (it imports torch._dynamo before the group exists: see start_ddp)
timeout = datetime.timedelta(seconds=int(os.environ.get("TIMEOUT_S", "20")))
device = parallel.start_ddp(os.environ.get("DEVICE", "cpu"), timeout)


def say(line: str) -> None:
    """One write per line: both ranks share torchrun's stdout, and print's separate newline let
    one rank's line run into the other's ("...=TrueRANK 1: ...")."""
    os.write(1, (line + "\n").encode())


def main() -> int:
    """The run; returns this rank."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3).to(device)
    ref = torch.nn.Linear(8, 3).to(device)
    ref.load_state_dict(model.state_dict())
    ddp = parallel.wrap(model, device)
    data = {}
    for r in range(2):
        g = torch.Generator().manual_seed(10 + r)
        data[r] = [
            (torch.randn(8, 8, generator=g).to(device), torch.randint(0, 3, (8,), generator=g).to(device))
            for _ in range(3)
        ]
    calls = []

    def batch_loss(batch):
        x, y = batch
        calls.append(len(x))
        if rank == 1 and len(x) > 4 and len(calls) > 1:  # rank 1 runs out of memory from its 2nd batch on
            raise gpu.OutOfMemoryError("fake: CUDA out of memory on rank 1")
        return torch.nn.functional.cross_entropy(ddp(x), y), len(x)

    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    batching = engine.Batching(8, 1, 0.5)
    grads = parallel.GradSync(ddp, device) if os.environ.get("AGREE", "1") == "1" else None  # None: DDP's own
    steps.run_epoch(data[rank], 3, batch_loss, opt, sched, gpu.Amp("off", device), batching, grads=grads)
    parallel.check_in_sync(ddp, device)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)  # one process: the mean of both ranks' losses
    for i in range(3):
        ref_opt.zero_grad()
        sum(torch.nn.functional.cross_entropy(ref(data[r][i][0]), data[r][i][1]) / 2 for r in range(2)).backward()
        ref_opt.step()
    same = all(torch.allclose(p, q, atol=1e-6) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    say(f"RANK {rank}: parts={batching.parts} calls={calls} same_as_one_process={same}")
    return rank


rank = main()
parallel.finish_ddp()
# rank 1's caught out-of-memory errors held the DDP model in a reference cycle: without finish_ddp's
# gc.collect, gloo's threads outlived the group and aborted the interpreter's exit
threads = [p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")]
say(f"RANK {rank} gloo threads after finish_ddp: {[t for t in threads if 'gloo' in t]}")
