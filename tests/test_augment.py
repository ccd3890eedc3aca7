"""BatchRandAugment: each sample gets RandAugment's ops as if augmented alone, with its own draws."""

import collections
import math
import pickle

import pytest
import torch
from torchvision.transforms.v2 import functional as F

from vit_lightning.data.augment import BatchRandAugment
from vit_lightning.data.datamodule import CIFAR10_STATS, BatchCollate


def reference_op(img: torch.Tensor, name: str, bin_: int, negative: bool) -> torch.Tensor:
    """RandAugment's ops at magnitude bin `bin_` of 31 (torchvision's table), written out for one image."""
    h, w = img.shape[-2:]
    level = bin_ / 30  # linspace(0, max, 31)[bin]
    sign = -1.0 if negative else 1.0
    if name == "Identity":
        return img
    if name in ("ShearX", "ShearY"):
        angle = math.degrees(math.atan(sign * 0.3 * level))
        shear = [angle, 0.0] if name == "ShearX" else [0.0, angle]
        return F.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, center=[0, 0])
    if name in ("TranslateX", "TranslateY"):
        shift = int(sign * 150 / 331 * (w if name == "TranslateX" else h) * level)
        translate = [shift, 0] if name == "TranslateX" else [0, shift]
        return F.affine(img, angle=0.0, translate=translate, scale=1.0, shear=[0.0, 0.0])
    if name == "Rotate":
        return F.rotate(img, angle=sign * 30 * level)
    factor = 1.0 + sign * 0.9 * level
    simple = {"Brightness": F.adjust_brightness, "Color": F.adjust_saturation, "Contrast": F.adjust_contrast,
              "Sharpness": F.adjust_sharpness}
    if name in simple:
        return simple[name](img, factor)
    if name == "Posterize":
        return F.posterize(img, bits=int(round(8 - bin_ / 7.5)))
    if name == "Solarize":
        return F.solarize(img, threshold=255.0 * (1.0 - level))
    return F.autocontrast(img) if name == "AutoContrast" else F.equalize(img)


def test_each_sample_gets_its_own_ops_as_if_alone():
    torch.manual_seed(0)
    aug = BatchRandAugment()
    x = torch.randint(0, 256, (96, 3, 12, 10), dtype=torch.uint8)
    ops, negative = aug.draw(len(x))
    assert ops.shape == negative.shape == (2, 96)
    assert len(set(ops[0].tolist())) == 14 and 0 < negative.float().mean() < 1  # draws really differ per sample
    out = aug.apply(x, ops, negative)
    names = [name for name, _ in aug.space]
    expected = torch.stack([reference_op(reference_op(x[i], names[ops[0, i]], 9, bool(negative[0, i])),
                                         names[ops[1, i]], 9, bool(negative[1, i])) for i in range(len(x))])
    # The colour blends compute in float: a batch may round a rare pixel the other way than a lone image.
    diff = (out.int() - expected.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3
    assert not torch.equal(out, x) and torch.equal(x, x.clone())  # the input is left as it was


def test_draws_follow_the_global_seed():
    aug = BatchRandAugment()
    x = torch.randint(0, 256, (16, 1, 8, 8), dtype=torch.uint8)  # one channel, as MNIST
    torch.manual_seed(3)
    a = aug(x)
    torch.manual_seed(3)
    assert torch.equal(a, aug(x))


def test_collate_with_randaugment_reaches_workers_and_normalises():
    collate = BatchCollate(*CIFAR10_STATS, size=32, pad=4, flip=True, augment=BatchRandAugment())
    collate = pickle.loads(pickle.dumps(collate))  # DataLoader workers may receive it pickled
    samples = [(torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8), i % 10) for i in range(8)]
    x, y = collate(samples)
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and y.tolist() == [i % 10 for i in range(8)]


# --- the same augmentation on the training device (data.augment_on=device) --------------------------------------
def device_path(randaugment=True, batch_size=64):
    """A synthetic-data module whose training batches are augmented after the transfer, as fit runs it."""
    from types import SimpleNamespace

    from vit_lightning.data.datamodule import ImageDataModule

    dm = ImageDataModule("synthetic", batch_size=batch_size, randaugment=randaugment, augment_on="device")
    dm.setup("fit")
    dm.trainer = SimpleNamespace(training=True, world_size=1, global_rank=0)  # what on_after_batch_transfer reads of the trainer
    return dm


def test_the_device_path_gives_the_cpu_paths_batch_for_the_same_seed():
    from vit_lightning.data.datamodule import ImageDataModule

    cpu = ImageDataModule("synthetic", batch_size=64, randaugment=True, augment_on="cpu")
    cpu.setup("fit")
    device = device_path()
    assert not cpu.train_collate.defer and device.train_collate.defer
    outs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        x, y = next(iter(device.train_dataloader()))  # the loader stacks uint8 only
        assert x.dtype == torch.uint8
        outs.append(device.on_after_batch_transfer((x, y), 0))
    assert torch.equal(outs[0][0], outs[1][0]) and not torch.equal(outs[0][0], outs[2][0])  # seeded
    torch.manual_seed(7)
    x, y = next(iter(cpu.train_dataloader()))
    assert x.dtype == torch.float32 and torch.equal(y, outs[0][1])
    assert torch.allclose(x, outs[0][0], atol=1e-5)  # the same draws, ops, crop, flip and normalisation
    device.trainer.training = False  # validation batches pass unchanged
    assert device.on_after_batch_transfer((x, y), 0)[0] is x


def recorded_ops(monkeypatch, make_batch, rounds: int) -> collections.Counter:
    """(op name, magnitude) -> how many samples went through it, over `rounds` batches."""
    from vit_lightning.data import augment

    seen = collections.Counter()
    real = augment.apply_op

    def spy(ra, x, name, magnitude):
        seen[(name, round(float(magnitude), 4))] += len(x)
        return real(ra, x, name, magnitude)

    monkeypatch.setattr(augment, "apply_op", spy)
    for k in range(rounds):
        torch.manual_seed(1000 + k)
        make_batch()
    monkeypatch.undo()
    return seen


def test_the_device_path_draws_the_cpu_paths_ops_and_magnitudes(monkeypatch):
    from vit_lightning.data.datamodule import ImageDataModule

    cpu = ImageDataModule("synthetic", batch_size=128, randaugment=True, augment_on="cpu")
    cpu.setup("fit")
    device = device_path(batch_size=128)
    cpu_ops = recorded_ops(monkeypatch, lambda: next(iter(cpu.train_dataloader())), 12)
    torch.manual_seed(0)  # other seeds than the CPU path's: the same distribution, not the same draws
    device_loader = device.train_dataloader()

    def device_batch():
        torch.manual_seed(int(torch.randint(10**6, (1,))) + 7)
        device.on_after_batch_transfer(next(iter(device_loader)), 0)

    device_ops = recorded_ops(monkeypatch, device_batch, 12)
    aug = BatchRandAugment()
    applied = [name for name, _ in aug.space if name != "Identity"]  # Identity leaves the image as it is
    total = 12 * 128 * aug.num_ops
    for ops in (cpu_ops, device_ops):
        names = collections.Counter()
        for (name, _), n in ops.items():
            names[name] += n
        assert sorted(names) == sorted(applied)
        for name in applied:  # each op on 1/14 of the draws: within 5 standard deviations of a binomial
            p = 1 / len(aug.space)
            assert abs(names[name] - total * p) < 5 * math.sqrt(total * p * (1 - p)), (name, names[name])
        for name, (_, signed) in aug.space:  # magnitude bin 9 of 31, and both signs for the signed ops
            if name in applied:
                magnitudes = {m for (n, m) in ops if n == name}
                value = round(aug.magnitude_of([n for n, _ in aug.space].index(name), 32, 32), 4)
                assert magnitudes == ({value, -value} if signed and value else {value}), name
    # the two paths' frequencies agree: total variation distance of (op, magnitude) under 0.05
    keys = set(cpu_ops) | set(device_ops)
    tv = 0.5 * sum(abs(cpu_ops[k] / sum(cpu_ops.values()) - device_ops[k] / sum(device_ops.values())) for k in keys)
    assert set(cpu_ops) == set(device_ops) and tv < 0.05, tv


def test_augment_on_is_checked_in_one_line(tmp_path):
    from vit_lightning.data.datamodule import ImageDataModule

    with pytest.raises(ValueError, match="unknown data.augment_on 'gpu'; valid: auto, cpu, device"):
        ImageDataModule(augment_on="gpu")
    for cls in ("a", "b"):
        for split in ("train", "val"):
            (tmp_path / split / cls).mkdir(parents=True)
    with pytest.raises(ValueError, match="augment_on=device needs a dataset held in memory"):
        ImageDataModule("imagefolder", root=str(tmp_path), augment_on="device")
    auto = ImageDataModule("synthetic", randaugment=True)
    auto.setup("fit")
    assert not auto.train_collate.defer  # auto without a GPU trainer: the CPU loader augments
