"""Which position encoding survives a higher resolution: ours, after section 3.2 of Dosovitskiy et al. 2021.

The paper fine-tunes at a higher resolution than it pre-trains at, keeping the patch size, so the
patch grid grows and the position embeddings are resampled by 2-D interpolation on it ("the only
points at which an inductive bias about the 2-D structure is manually injected"). Each run of the
pos_encoding ablation's profile is the source of one trial here: evaluated at the new resolution
before any step (transfer/start_acc), then fine-tuned there (val/acc_best). Expected: learned tables
lose accuracy when first interpolated and recover with fine-tuning; relative encodings and none
lose less at the start; after fine-tuning the encodings are alike again.

Each trial names its source by trial id (model.init_from = runs/pos_encoding/<profile>/<id>), the
id the source's own sweep gives it with one process per trial; the sweep refuses to start, in one
line naming the missing runs and the command that makes them, until they have all finished.

Run:  vit-ablate sweep pos_encoding && vit-ablate sweep transfer     # demo: mnist5k 28 px -> 56 px, CPU
      vit-ablate sweep transfer --profile cifar10                   # 32 px -> 64 px, the paper's recipe
      vit-ablate table transfer                                     # the table
"""

from vit_lightning.ablation import METRIC, SHUFFLE_COLUMN, Ablation, Profile, profile, runs_of

from . import pos_encoding

ENC, INJ, SOURCE = "model.pos_encoding", "model.pos_injection", "model.init_from"
# The paper's fine-tuning recipe (Table 4, appendix B.1.1): SGD with momentum 0.9, no weight decay,
# gradient clipping at global norm 1, cosine decay after a linear warm-up, batch 512. The paper picks
# the learning rate from {0.003, 0.01, 0.03, 0.06} per task; we fix the middle one.
FINE_TUNE = {
    "model.optimizer": "sgd",
    "model.momentum": 0.9,
    "model.weight_decay": 0.0,
    "model.lr": 0.01,
    "model.schedule": "cosine",
    "model.label_smoothing": 0.0,
    "trainer.gradient_clip_val": 1.0,
}
NO_MIX = {"data.mixup_alpha": 0.0, "data.cutmix_alpha": 0.0, "data.randaugment": False}


def transfer_profile(source: Ablation, name: str, fixed: dict, description: str) -> Profile:
    """A profile fine-tuning every run of source's profile `name` once (seed 0) with `fixed` settings."""
    return profile(name, runs_of(source, name, SOURCE), fixed=fixed, seeds=(0,), description=description)


ABLATION = Ablation(
    name="transfer",
    title="Position encodings at a higher resolution: before and after fine-tuning",
    source="section 3.2 (fine-tuning at higher resolution); ours",
    finding="Ours: after fine-tuning at the higher resolution the encodings perform alike, as when pre-trained.",
    metric=METRIC,
    rows=ENC,
    cols=INJ,
    layout="grid",
    replicates=SOURCE,  # the source runs (one per source seed) replicate a cell
    columns={"transfer/source_acc": "source (its resolution)", "transfer/start_acc": "new resolution, not fine-tuned",
             **SHUFFLE_COLUMN},
    reference={},
    reference_note="the paper reports no per-encoding transfer numbers; the source column is the pos_encoding run",
    profiles={
        # patch 7: the 4x4 grid at 28 px becomes 8x8 at 56 px
        "demo": transfer_profile(pos_encoding.ABLATION, "demo",
                                 {**FINE_TUNE, "data.img_size": 56, "data.batch_size": 32, "model.warmup_epochs": 0.5,
                                  "trainer.max_epochs": 3}, "mnist5k 28 px -> 56 px, micro ViT/7, CPU"),
        # about 100 steps an epoch at batch 512: 10,000 steps (Table 4), 500 of them warm-up
        "cifar10": transfer_profile(pos_encoding.ABLATION, "cifar10",
                                    {**FINE_TUNE, **NO_MIX, "data.img_size": 64, "data.batch_size": 512,
                                     "model.warmup_epochs": 5, "trainer.max_epochs": 100},
                                    "CIFAR-10 32 px -> 64 px, ViT-S/4"),
        # 2,500 steps an epoch at batch 512: 20,000 steps (Table 4), 500 of them warm-up
        "imagenet": transfer_profile(pos_encoding.ABLATION, "imagenet",
                                     {**FINE_TUNE, **NO_MIX, "data.img_size": 384, "data.batch_size": 512,
                                      "model.warmup_epochs": 0.2, "trainer.max_epochs": 8},
                                     "ImageNet 224 px -> 384 px, ViT-B/16"),
    },
)
