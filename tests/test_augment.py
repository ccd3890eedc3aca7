"""BatchRandAugment: each sample gets RandAugment's ops as if augmented alone, with its own draws."""

import math
import pickle

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
