"""data.decode_on=device: the workers read JPEG bytes, the batch is decoded and transformed on the training device with
the CPU path's draws, a PNG is decoded in the worker, a fit records where it decoded, and bad values are one line."""

import collections
import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from tiny import TINY_MODEL
from torchvision.transforms import v2

from vit_lightning.data.datamodule import IMAGENET_STATS, ImageDataModule
from vit_lightning.data.decode import Encoded, decode_place, nvjpeg_works

SIZE = 32  # the model's side; the centre path resizes the shorter side to round(32 / 0.875) = 37 first
CROP = round((37 - SIZE) / 2), round((48 - SIZE) / 2)  # a 37 x 48 image's centre crop (Python rounds 2.5 to 2)
MEAN, STD = (np.array(s, dtype=np.float32).reshape(3, 1, 1) * 255 for s in IMAGENET_STATS)


def write_folder(root: Path, shape=(37, 48), count: int = 6, png: int | None = None) -> Path:
    """train/ and val/ of 2 classes of smooth, lopsided RGB JPEGs (H, W = shape); image `png` saved as a grey PNG."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for i in range(count):
            folder = root / split / f"c{i % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            coarse = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
            pixels = np.asarray(Image.fromarray(coarse).resize(shape[::-1], Image.BICUBIC))
            pixels = np.clip(pixels + rng.normal(0, 6, pixels.shape), 0, 255).astype(np.uint8)
            if split == "train" and i == png:
                Image.fromarray(pixels[..., 0], "L").save(folder / f"{i}.png")
            else:
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


def module(root: Path, decode_on: str, **options) -> ImageDataModule:
    """An imagefolder module set up for fit, then given a CPU trainer that trains (as on_after_batch_transfer sees)."""
    dm = ImageDataModule("imagefolder", root=str(root), img_size=SIZE, batch_size=6, decode_on=decode_on, **options)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(training=True, world_size=1, global_rank=0,  # what the module reads of a trainer
                                 strategy=SimpleNamespace(root_device=torch.device("cpu")))
    return dm


def device_batch(dm: ImageDataModule) -> tuple[torch.Tensor, torch.Tensor]:
    """The first training batch as the device path gives it to the model (here the CPU is the device)."""
    encoded, y = next(iter(dm.train_dataloader()))
    assert isinstance(encoded, Encoded) and all(img.dtype == torch.uint8 for img in encoded.images)
    return dm.on_after_batch_transfer((encoded.to("cpu"), y), 0)


def in_levels(x: torch.Tensor) -> torch.Tensor:
    """A normalised batch back in 0-255 pixel levels."""
    return x * torch.as_tensor(STD) + torch.as_tensor(MEAN)


def test_decoding_on_the_device_gives_pils_pixels_within_the_decoders_tolerance(tmp_path):
    root = write_folder(tmp_path)  # 37 px shorter side: the centre path only crops, so only the decoders differ
    dm = module(root, "device", random_crop=False, flip=False)
    encoded, y = dm.train_collate([dm.train_set[i] for i in range(len(dm.train_set))])
    assert all(img.dim() == 1 for img in encoded.images)  # the workers read bytes, nothing decoded
    x = dm.train_collate.finish(encoded)
    assert x.shape == (6, 3, SIZE, SIZE) and x.dtype == torch.float32
    for i, (path, label) in enumerate(dm.train_set.samples):  # PIL's decode, cropped and normalised by hand
        pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32).transpose(2, 0, 1)  # (3, 37, 48)
        top, left = CROP
        expected = (pixels[:, top:top + SIZE, left:left + SIZE] - MEAN) / STD
        diff = (x[i].numpy() - expected) * STD  # in pixel levels
        assert np.abs(diff).max() <= 2 and np.abs(diff).mean() < 0.5, (path, np.abs(diff).max())
        assert y[i] == label
    # with a resize (the shorter side 60 -> 37) too, the CPU path's batch within a level or two on average
    big = write_folder(tmp_path / "big", shape=(60, 80))
    torch.manual_seed(0)
    cpu = next(iter(module(big, "cpu", random_crop=False, flip=False).train_dataloader()))[0]
    torch.manual_seed(0)
    diff = (in_levels(device_batch(module(big, "device", random_crop=False, flip=False))[0]) - in_levels(cpu)).abs()
    assert diff.max() <= 3 and diff.mean() < 0.5


def test_crop_and_flip_draw_the_cpu_paths_boxes_and_flips_for_the_same_seed(tmp_path):
    root = write_folder(tmp_path, shape=(60, 80))
    cpu_dm, device_dm = module(root, "cpu"), module(root, "device")
    assert cpu_dm.random_crop and cpu_dm.flip  # the folder's defaults: RandomResizedCrop and flips on
    batches = {}
    for seed in (5, 6):
        torch.manual_seed(seed)
        batches["cpu", seed] = in_levels(next(iter(cpu_dm.train_dataloader()))[0])
        torch.manual_seed(seed)
        batches["device", seed] = in_levels(device_batch(device_dm)[0])
    same = (batches["cpu", 5] - batches["device", 5]).abs().mean(dim=(1, 2, 3))  # per image
    other = (batches["cpu", 5] - batches["device", 6]).abs().mean(dim=(1, 2, 3))
    # the same crop box and flip: PIL's and torch's bilinear resampling differ by a fraction of a level
    assert same.max() < 1.5, same
    assert (other > 5).sum() >= 4, other  # another seed's boxes: other pixels
    # each image's own flip matters here: mirrored, the same seed's device images would not match
    mirrored = (batches["cpu", 5] - batches["device", 5].flip(-1)).abs().mean(dim=(1, 2, 3))
    assert (mirrored > 5).all(), mirrored


def test_randaugment_draws_the_cpu_paths_ops_and_magnitudes_for_the_same_seed(tmp_path, monkeypatch):
    root = write_folder(tmp_path, shape=(60, 80), count=24)
    applied = collections.Counter()
    real = v2.RandAugment._apply_image_or_video_transform

    def spy(self, image, name, magnitude, **kwargs):  # both paths apply each op through RandAugment's own dispatch
        n = image.shape[0] if isinstance(image, torch.Tensor) and image.dim() == 4 else 1
        applied[name, round(float(magnitude), 4)] += n
        return real(self, image, name, magnitude, **kwargs)

    monkeypatch.setattr(v2.RandAugment, "_apply_image_or_video_transform", spy)
    drawn = {}
    for where in ("cpu", "device"):
        dm = module(root, where, randaugment=True)
        dm.hparams.batch_size = 24
        applied.clear()
        for seed in range(4):
            torch.manual_seed(seed)
            next(iter(dm.train_dataloader())) if where == "cpu" else device_batch(dm)
        applied.pop(("Identity", 0.0), None)  # the batched path skips Identity, the per-image one applies it
        drawn[where] = dict(applied)
    assert sum(drawn["cpu"].values()) > 4 * 24 * 2 * 0.8  # 2 ops per image; Identity is 1 in 14 of them
    assert len({name for name, _ in drawn["cpu"]}) >= 8 and any(m < 0 for _, m in drawn["cpu"])  # ops and signs vary
    assert drawn["device"] == drawn["cpu"]  # the same ops at the same magnitudes and signs, image for image


def test_a_png_is_decoded_in_the_worker_and_trains_beside_the_jpegs(tmp_path):
    root = write_folder(tmp_path, png=2)  # a grey PNG: the worker decodes it to RGB
    dm = module(root, "device", random_crop=False, flip=False)
    index = next(i for i, (path, _) in enumerate(dm.train_set.samples) if path.endswith(".png"))
    read = dm.train_set[index][0]
    assert read.shape == (3, 37, 48) and read.dtype == torch.uint8 and torch.equal(read[0], read[2])
    x = dm.train_collate.finish(dm.train_collate([dm.train_set[i] for i in range(len(dm.train_set))])[0])
    grey = np.asarray(Image.open(dm.train_set.samples[index][0]), dtype=np.float32)[None]  # lossless: exact
    top, left = CROP
    expected = (grey[:, top:top + SIZE, left:left + SIZE] - MEAN) / STD
    assert np.allclose(x[index].numpy(), expected, atol=1e-4)
    view, labels = dm.unaugmented_train()  # few-shot probes read the training split decoded, as validation sees it
    assert view[index][0].shape == (3, SIZE, SIZE) and len(labels) == len(dm.train_set)
    pickle.dumps((dm.train_set, dm.train_collate))  # workers can receive them


def test_auto_decodes_on_the_device_only_on_a_gpu_whose_nvjpeg_works(tmp_path):
    cpu = torch.device("cpu")
    assert decode_place("auto", cpu, in_memory=False) == "cpu" and decode_place("auto", None, in_memory=False) == "cpu"
    assert decode_place("device", cpu, in_memory=False) == "device" and decode_place("cpu", cpu, False) == "cpu"
    assert decode_place("auto", cpu, in_memory=True) == "cpu"  # data in memory is not decoded in training
    if not torch.cuda.is_available():
        assert not nvjpeg_works(torch.device("cuda")) and decode_place("auto", torch.device("cuda"), False) == "cpu"
    dm = module(write_folder(tmp_path), "auto")
    assert not dm.decodes_on_device() and not dm.augments_on_device() and not dm.train_collate.defer  # today's path


def test_bad_decode_on_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^unknown data.decode_on 'gpu'; valid: auto, cpu, device$"):
        ImageDataModule(decode_on="gpu")
    with pytest.raises(ValueError) as err:
        ImageDataModule("synthetic", decode_on="device")
    assert "\n" not in str(err.value) and str(err.value).startswith("data.decode_on=device: only imagefolder decodes")
    ImageDataModule("synthetic", decode_on="cpu")  # cpu and auto are fine for any dataset


@pytest.mark.slow
def test_a_fit_decoding_on_the_device_trains_and_records_where_it_decoded(tmp_path):
    from vit_lightning.commands.fit import main as train

    root = write_folder(tmp_path / "data", count=16)
    compute, losses = {}, {}
    for where, workers in (("device", 1), ("auto", 0)):  # a worker process: the bytes travel through its queue
        runs = tmp_path / where
        argv = [*TINY_MODEL, "--data.name=imagefolder", f"--data.root={root}", "--data.img_size=16",
                "--model.patch_size=8", "--data.batch_size=8", "--data.randaugment=true", f"--data.decode_on={where}",
                f"--data.num_workers={workers}", "--trainer.max_epochs=1", "--trainer.limit_val_batches=1",
                "--run.wandb=off", "--run.fewshot_shots=[]", "--run.shuffle_perms=0", f"--run.root={runs}"]
        assert train.main(argv) == 0
        [path] = runs.rglob("results.json")
        record = json.loads(path.read_text())
        assert record["status"] == "completed" and record["metrics"]["steps"] == 2, record["error"]
        compute[where] = (record["compute"]["decode_on"], record["compute"]["augment_on"])
        losses[where] = record["history"][-1]["train/loss"]
    assert compute == {"device": ("device", "device"), "auto": ("cpu", "cpu")}  # auto without a GPU: today's path
    # the same seed: the same crops, flips and ops on the same images (here drawn in the training process by both
    # paths), so the same losses but for the two decoders' and resamplers' last-level differences
    assert losses["device"] == pytest.approx(losses["auto"], abs=0.01)


def test_where_it_decodes_is_not_part_of_a_runs_identity():
    from vit_lightning.model.family import trial_name as run_name

    base = {"data.name": "imagefolder", "model.patch_size": 16, "data.randaugment": True}
    assert run_name({**base, "data.decode_on": "device"}) == run_name({**base, "data.decode_on": "cpu"}) == run_name(base)
    assert run_name({**base, "data.randaugment": False}) != run_name(base)
