"""The batch / worker / precision rules (template/hardware.py, shared by CLI and train.py)."""

from __future__ import annotations

import pytest

from kagtpl.new import detect_gpu
from kagtpl.template import hardware, profiles

hw = hardware()


@pytest.mark.parametrize(
    "gpu,model,size,batch,aggressive",
    [
        ("a10", "efficientnet_b4", 224, 128, 192),  # the field notes' A10 anchor
        ("a10", "resnet50", 224, 128, 192),
        ("a10", "efficientnet_b4", 384, 64, 96),  # 384 px anchor
        ("a10", "efficientnet_b7", 224, 64, 96),  # B6/B7 anchor
        ("a100-40", "efficientnet_b4", 224, 192, 256),  # A100-40 anchor
        ("t4", "efficientnet_b4", 224, 64, 96),
        ("h100", "efficientnet_b4", 224, 416, 480),
        ("t4", "efficientnet_b7", 512, 32, 48),  # never below 32 on a GPU
        ("p100", "efficientnet_b4", 224, 40, 56),  # fp32 halves the budget
    ],
)
def test_batch_rule_hits_the_anchors(gpu, model, size, batch, aggressive):
    rec = hw.recommend(hw.PROFILES[gpu], model, size)
    assert (rec.batch_size, rec.aggressive_batch) == (batch, aggressive)


def test_no_gpu_profile_goes_below_32_and_accumulation_reaches_128():
    for profile in hw.PROFILES.values():
        for model in ("resnet18", "efficientnet_b4", "efficientnet_b7", "vit_large_patch16_224"):
            for size in (224, 384, 512, 1024):
                rec = hw.recommend(profile, model, size)
                if profile.is_gpu:
                    assert rec.batch_size >= 32
                    assert abs(rec.batch_size * rec.accum_steps - 128) <= rec.batch_size / 2 or rec.accum_steps == 1


def test_user_batch_is_kept():
    assert hw.recommend(hw.PROFILES["a10"], "resnet18", 224, batch_size=48).batch_size == 48


@pytest.mark.parametrize("cpus,workers,prefetch", [(1, 0, None), (2, 1, 4), (4, 3, 4), (8, 7, 3), (30, 12, 3)])
def test_workers_rule(cpus, workers, prefetch):
    s = hw.loader_settings(cpus, on_cuda=True)
    assert (s["num_workers"], s["prefetch_factor"], s["persistent_workers"]) == (workers, prefetch, workers > 0)
    assert hw.loader_settings(cpus, on_cuda=False)["pin_memory"] is False


def test_where_the_cpu_trains_the_rule_gives_no_loader_worker_and_a_flag_still_does(monkeypatch):
    """--workers -1 (the rule) on the CPU: none, the line's note says why; on a card: the usable
    CPUs less one; --workers N: N anywhere. `kagtpl recommend --gpu cpu` says the same."""
    monkeypatch.setattr(hw, "usable_cpus", lambda: 4)
    cpu = hw.flag_loader(-1, "cpu")  # the DataLoader line's note: test_run.py's dry run
    assert (cpu["num_workers"], cpu["prefetch_factor"], cpu["persistent_workers"]) == (0, None, False)
    assert hw.flag_loader(-1, "cuda")["num_workers"] == 3  # --workers 2 on the CPU: test_machinery's loader
    rec = hw.recommend(hw.PROFILES["cpu"], "resnet18", 224, cpus=4)
    assert rec.loader["num_workers"] == 0 and rec.why["num_workers"] == hw.CPU_TRAINS
    assert hw.recommend(hw.PROFILES["t4"], "resnet18", 224, cpus=4).loader["num_workers"] == 3


@pytest.mark.parametrize(
    "gpu,mode", [("t4", "fp16"), ("v100", "fp16"), ("p100", "fp32"), ("a10", "bf16"), ("h100", "bf16"), ("cpu", "off")]
)
def test_amp_mode_from_compute_capability(gpu, mode):
    assert hw.amp_mode(hw.PROFILES[gpu].capability) == mode
    assert hw.PROFILES[gpu].bf16_native == (mode == "bf16")


@pytest.mark.parametrize(
    "model,cls",
    [
        ("resnet18", "small"),
        ("efficientnet_b0", "small"),
        ("tf_efficientnet_b4.ns_jft_in1k", "large"),
        ("resnet152", "large"),
        ("vit_base_patch16_224", "large"),
        ("efficientnet_b7", "heavy"),
        ("mobilenetv3_large_100", "small"),
    ],
)
def test_model_class(model, cls):
    assert hw.model_class(model) == cls


def test_unknown_model_falls_back_to_parameter_count():
    assert hw.model_class("my_net", params_m=3.0) == "small"
    assert hw.model_class("my_net", params_m=60.0) == "large"


@pytest.mark.parametrize(
    "smi,profile",
    [
        ("NVIDIA A10, 23028", "a10"),
        ("NVIDIA A100-SXM4-40GB, 40960", "a100-40"),
        ("NVIDIA A100-SXM4-80GB, 81920", "a100-80"),
        ("Tesla T4, 15360\nTesla T4, 15360", "t4"),
        ("NVIDIA H100 80GB HBM3, 81559", "h100"),
        ("NVIDIA GeForce RTX 4090, 24564", "rtx4090"),
        ("NVIDIA A10G, 23028", "a10g"),
        ("NVIDIA H200, 143771, 9.0", "h200"),
        ("NVIDIA B200, 183359, 10.0", "b200"),
        ("NVIDIA L40S, 46068, 8.9", "l40s"),
        ("NVIDIA A40, 46068, 8.6", "a40"),
        ("NVIDIA RTX A6000, 49140, 8.6", "rtx-a6000"),
        ("NVIDIA L4, 23034, 8.9", "l4"),
        ("", "cpu"),
    ],
)
def test_detect_gpu_from_nvidia_smi_text(smi, profile):
    assert detect_gpu(smi) == profile


@pytest.mark.parametrize(
    "smi,profile",
    [
        ("NVIDIA A30, 24576, 8.0", "a10"),  # bf16, 24 GB: the A10's rules, not the CPU's
        ("NVIDIA RTX A4000, 16376, 8.6", "a10"),  # not the A40 its name contains; the nearest bf16 memory
        ("Quadro RTX 8000, 49152, 7.5", "v100-32"),  # fp16 card: the fp16 profile nearest in memory
    ],
)
def test_unlisted_gpu_gets_the_nearest_profile_and_a_warning(smi, profile, capsys):
    assert detect_gpu(smi) == profile
    assert "is not in kagtpl's table: using the nearest profile" in capsys.readouterr().err


def test_unlisted_gpu_at_run_time_gets_a_profile_built_from_the_card():
    profile, warning = profiles().profile_for("NVIDIA A30", 24.0, (8, 0), cpus=8)
    assert profile.name == "custom" and profile.is_gpu and profile.memory_gb == 24
    assert hardware().amp_mode(profile.capability) == "bf16" and "not in kagtpl's table" in warning
    rec = hardware().recommend(profile, "efficientnet_b4", 224)
    assert rec.batch_size == 128 and rec.amp == "bf16"  # a 24 GB bf16 card: the A10's batch, not the CPU's 32
    assert profiles().profile_for("NVIDIA H200", 140.0, (9, 0), cpus=8) == (hardware().PROFILES["h200"], "")
    assert profiles().profile_for("cpu", 0.0, None, cpus=2)[0].name == "cpu"
