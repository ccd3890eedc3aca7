"""Patch size: Figure 8 / Table 5 of Dosovitskiy et al. 2021 (ViT-B/32 vs B/16, L/16 vs L/14 ...).

Expected: smaller patches mean longer sequences, more compute and higher accuracy; the
gain per halving of the patch shrinks. Read accuracy together with GFLOPs per image.

The transfer view (FlexiViT, Beyer et al. 2023) evaluates each trained patch size at every other one without
fine-tuning, the patch kernel PI-resized and the position table resampled; expected: accuracy falls with the
distance from the trained patch size, more steeply towards larger patches (FlexiViT's ViT-S/16 row is shown).

Run:  vit-ablate sweep patch_size                        # demo: 28 px mnist5k, patches 2/4/7/14
      vit-ablate sweep patch_size --profile cifar10      # 32 px, patches 2/4/8
      for run in runs/patch_size/demo/*/; do for p in 2 4 7 14; do
          vit-ablate eval "$run" --model.patch_size=$p --shots --into-record; done; done   # the transfer view
      # the grid-kept rows: the image resized with the patch, S = the trained grid's side x p (28 / own patch x p)
      vit-ablate eval RUN --model.patch_size=$p --data.img_size=$S --shots --into-record
      vit-ablate table patch_size
"""

from vit_lightning.ablation import METRIC, Ablation, profile

PATCH = "model.patch_size"
SIZES = {"demo": [2, 4, 7, 14], "cifar10": [2, 4, 8], "imagenet": [8, 16, 32]}  # each divides the image

ABLATION = Ablation(
    name="patch_size",
    naming=1,  # the naming rule its committed runs were named by: their names and sweep YAMLs stay
    title="Patch size: sequence length vs accuracy and compute",
    source="Figure 8 / Table 5",
    finding="Smaller patches (longer sequences) give higher accuracy at more compute.",
    metric=METRIC,
    rows=PATCH,
    cols=None,
    layout="compute",
    reference={32: 0.8073, 16: 0.8415},
    reference_note="ViT-B/32 and ViT-B/16 pre-trained 7 epochs on JFT-300M, ImageNet fine-tuned top-1 (Table 5)",
    # FlexiViT (Beyer et al. 2023): a model trained at one patch size, PI-resized to others, no fine-tuning
    patch_transfer_reference={8: 0.7631, 12: 0.8156, 14: 0.8193, 16: 0.8141, 24: 0.7361, 32: 0.5138, 48: 0.0403},
    patch_transfer_source="16",
    patch_transfer_note="timm's augreg in21k -> in1k ViT-S/16 evaluated at 224 px with PI-resized patches, ImageNet "
                        "top-1 (bwconrad/flexivit README); FlexiViT-S trained on random patch sizes reaches 82.2-82.6",
    profiles={
        name: profile(name, {PATCH: SIZES[name]}, description=desc)
        for name, desc in [
            ("demo", "mnist5k, micro ViT, CPU"),
            ("cifar10", "CIFAR-10, ViT-S"),
            ("imagenet", "ImageNet, ViT-B"),
        ]
    },
)
