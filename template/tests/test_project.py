"""Fast checks of this project's pieces on CPU: python -m pytest tests"""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hardware  # noqa: E402
import kit  # noqa: E402
import train  # noqa: E402


def test_model_and_transforms_give_class_scores():
    model = train.build_model({"model": "resnet18"}, num_classes=3)
    image = np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    x = train.make_transforms(32, train=True, hflip=True)(image=image)["image"]
    assert x.shape == (3, 32, 32)
    assert model.eval()(x[None]).shape == (1, 3)


def test_checkpoint_round_trip_and_corrupt_file_is_skipped(tmp_path):
    model = torch.nn.Linear(2, 3)
    kit.save_checkpoint(tmp_path / "model_fold0.pth", model, {"model": "x"}, ["a", "b", "c"], fold=0)
    (tmp_path / "model_fold1.pth").write_bytes(b"not a checkpoint")
    found = kit.fold_checkpoints(tmp_path)
    assert [p.name for p, _ in found] == ["model_fold0.pth"]
    assert torch.equal(found[0][1]["model"]["weight"], model.weight.detach())


def test_ensemble_rows_sum_to_one():
    a = np.array([[0.2, 0.8], [0.5, 0.5]])
    b = np.array([[0.4, 0.6], [0.1, 0.9]])
    np.testing.assert_allclose(kit.ensemble([a, b]).sum(1), 1.0)


@pytest.mark.parametrize("capability,mode", [((7, 5), "fp16"), ((8, 6), "bf16"), ((6, 0), "fp32"), (None, "off")])
def test_amp_mode(capability, mode):
    assert hardware.amp_mode(capability) == mode
