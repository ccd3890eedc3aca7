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

The fine-tuning learning rate is selected per cell, as the paper does per task from {0.003, 0.01, 0.03,
0.06}; the demo profiles add 0.1, 0.2 and 0.4 (on the paper's four every demo cell chose the largest, and a choice at
the edge of the grid is only a bound, which the table marks censored). The `<profile>_select` stage fine-tunes the
cell's seed-0 source at each candidate, validating on a held-out fifth of the training images (data.holdout; the
validation images of the table stay unseen), and the `<profile>` stage fine-tunes every source of the cell at the lr
whose held-out accuracy was best (model.lr = select:<profile>_select; the sweep refuses to start until the
selection has run). The source profiles declare 56 px in the three evaluation views (pos_encoding's `views`): the
sources evaluated there without fine-tuning with more tokens at their trained pixel scale, with the content zoomed
on their trained canvas, and resized (both, the view the "not fine-tuned" column measures); their tables show the
three. The `<profile>_scratch` stage is the control: each encoding trained from scratch at the new resolution for as
many steps as the fine-tuning, with the source's own recipe.

Run:  vit-ablate sweep pos_encoding                                 # demo: the sources, mnist5k 28 px
      vit-ablate sweep transfer --profile demo_select                # the lr per cell, on held-out digits
      vit-ablate sweep transfer --profile demo_select --extend-edges # again until no cell's best is at an edge
      vit-ablate sweep transfer && vit-ablate sweep transfer --profile demo_scratch   # 56 px; the control
      vit-ablate table transfer                                     # the table
      vit-ablate eval runs/pos_encoding/demo/*/ --declared --shots --into-record   # the sources at 56 px, 3 views
      vit-ablate sweep transfer --profile cifar10_select  (then cifar10, cifar10_scratch)   # 32 px -> 64 px
"""

import dataclasses

from vit_lightning.ablation import METRIC, SHUFFLE_COLUMN, Ablation, Profile, profile, runs_of, selected_by

from . import pos_encoding

ENC, INJ, SOURCE = "model.pos_encoding", "model.pos_injection", "model.init_from"
# The paper's fine-tuning recipe (Table 4, appendix B.1.1): SGD with momentum 0.9, no weight decay,
# gradient clipping at global norm 1, cosine decay after a linear warm-up, batch 512. The paper picks
# the learning rate from {0.003, 0.01, 0.03, 0.06} per task: the `_select` stage does it per cell.
FINE_TUNE = {
    "model.optimizer": "sgd",
    "model.momentum": 0.9,
    "model.weight_decay": 0.0,
    "model.lr": 0.01,
    "model.schedule": "cosine",
    "model.label_smoothing": 0.0,
    "trainer.gradient_clip_val": 1.0,
}
LR, LRS = "model.lr", [0.003, 0.01, 0.03, 0.06]
# The demo's selection on the paper's four chose 0.06, the largest, in every cell, its held-out accuracy still rising
# from 0.03 (by 0.011 for none up to 0.090 for sincos_2d): the table marks such a choice censored. The demo profiles
# select from a grid extended upward, so that a re-run of their `_select` stage can place each choice inside it.
DEMO_LRS = [*LRS, 0.1, 0.2, 0.4]
HOLDOUT = 0.2  # the share of the training images the selection validates on
NO_MIX = {"data.mixup_alpha": 0.0, "data.cutmix_alpha": 0.0, "data.randaugment": False}
# what the from-scratch control keeps of the fine-tuning: the new resolution and the number of steps
SAME_STEPS = ("data.img_size", "data.batch_size", "trainer.max_epochs")


def transfer_profile(source: Ablation, name: str, fixed: dict, description: str) -> Profile:
    """A profile fine-tuning every run of source's profile `name` once (seed 0) with `fixed` settings."""
    return profile(name, runs_of(source, name, SOURCE), fixed=fixed, seeds=(0,), description=description)


def transfer_profiles(source: Ablation, name: str, fixed: dict, description: str, base: str | None = None,
                      select_seed: int = 0, reference: dict | None = None, reference_note: str = "",
                      lrs: list[float] = LRS) -> dict[str, Profile]:
    """The three stages for source's profile `name`, on BASE[base or name]: `<name>_select` (each cell's source of
    seed `select_seed` fine-tuned at every lr of `lrs`, validated on held-out training images), `<name>` (every
    source fine-tuned at its cell's selected lr, beside other papers' `reference` numbers if given) and
    `<name>_scratch` (the control: from scratch, same steps)."""
    base = base or name
    tuned = {k: v for k, v in fixed.items() if k != LR}
    select = [{**block, LR: list(lrs)} for block in runs_of(source, name, SOURCE, seeds=(select_seed,))]
    scratch = {**{k: v for k, v in source.profile(name).fixed.items() if not k.startswith("run.")},
               **{k: fixed[k] for k in SAME_STEPS}}
    stages = [
        (f"{name}_select", profile(base, select, fixed={**tuned, "data.holdout": HOLDOUT}, seeds=(0,),
                                   description=f"{description}, lr selected on held-out training images")),
        (name, profile(base, runs_of(source, name, SOURCE), fixed={**tuned, LR: selected_by(f"{name}_select")},
                       seeds=(0,), description=description)),
        (f"{name}_scratch", profile(base, source.profile(name).grids, fixed=scratch,
                                    seeds=source.profile(name).seeds,
                                    description=f"{description}, from scratch at the new resolution")),
    ]
    out = {stage: dataclasses.replace(prof, name=stage) for stage, prof in stages}
    out[name] = dataclasses.replace(out[name], reference=reference, reference_note=reference_note)
    return out


# RoPE-ViT's numbers at a new resolution without fine-tuning (Heo et al. 2024, naver-ai/rope-vit README)
ROPE_VIT = {"learned_1d": "80.4 -> 79.4", "rope_axial": "80.9 -> 80.0", "rope_mixed": "80.9 -> 81.8"}
ROPE_VIT_NOTE = ("RoPE-ViT (Heo et al. 2024, naver-ai/rope-vit README): DeiT-III ViT-S/16 trained at 224 px, ImageNet-1k "
                 "top-1 % at 224 -> at 384 px without fine-tuning, to read against our 'new resolution (both: "
                 "resized), not fine-tuned' column (ViT-B: learned 83.4 -> 82.8, axial 83.6 -> 83.9, mixed 83.8 -> 84.4); the "
                 "paper reports no per-encoding transfer numbers")
DEMO = {**FINE_TUNE, "data.img_size": 56, "data.batch_size": 32, "model.warmup_epochs": 0.5, "trainer.max_epochs": 3}

ABLATION = Ablation(
    name="transfer",
    naming=1,  # the naming rule its committed runs were named by: their names and sweep YAMLs stay
    title="Position encodings at a higher resolution: before and after fine-tuning",
    source="section 3.2 (fine-tuning at higher resolution); ours",
    finding="Ours: after fine-tuning at the higher resolution the encodings perform alike, as when pre-trained.",
    metric=METRIC,
    rows=ENC,
    cols=INJ,
    layout="grid",
    replicates=SOURCE,  # the source runs (one per source seed) replicate a cell
    columns={"transfer/source_acc": "source (its resolution)",
             "transfer/start_acc": "new resolution (both: resized), not fine-tuned", **SHUFFLE_COLUMN},
    offsets={"transfer/start_acc": ("not fine-tuned, minus none's", {ENC: "none"})},
    controls={"_scratch": "from scratch at the new resolution, same steps"},
    column_notes={
        "source (its resolution)": "the source run's accuracy at the resolution it was trained at",
        "new resolution (both: resized), not fine-tuned": "the source evaluated at the new resolution before any "
        "step, its images resized (the view both: content zoom and more tokens at once), its encoding resampled "
        "(transfer/start_acc); it falls for every encoding, none included, because each patch now covers less of the "
        "image",
        "not fine-tuned, minus none's": "the previous column minus none's mean: the part of the drop the encoding's "
        "resampling explains (± the cell's own seed std)",
        "from scratch at the new resolution, same steps": "the control: the same encoding trained from scratch at "
        "the new resolution for as many steps as the fine-tuning (its `_scratch` stage)",
        "shuffle drop": "accuracy lost when each validation image's patches are permuted, after fine-tuning "
        "(val/shuffle_drop): how much the fine-tuned model uses position; the final weights' top-1 (the last epoch's "
        "val/acc) minus the same weights' top-1 on the shuffled images",
        "accuracy": "after fine-tuning at the selected lr, the best epoch's (val/acc_best; the drop's final weights "
        "score val/acc, in runs.csv)",
    },
    reference={},
    reference_note="the paper reports no per-encoding transfer numbers; the source column is the pos_encoding run",
    profiles={
        # patch 7: the 4x4 grid at 28 px becomes 8x8 at 56 px; a source profile's transfer is this one line
        **transfer_profiles(pos_encoding.ABLATION, "demo", DEMO, "mnist5k 28 px -> 56 px, micro ViT/7, CPU",
                            lrs=DEMO_LRS),
        # pos_encoding's `modern` runs, the same way on the demo's base settings
        **transfer_profiles(pos_encoding.ABLATION, "modern", DEMO, "mnist5k 28 px -> 56 px, micro ViT/7, CPU, the "
                            "encodings since the paper", base="demo", reference=ROPE_VIT, reference_note=ROPE_VIT_NOTE,
                            lrs=DEMO_LRS),
        # about 100 steps an epoch at batch 512: 10,000 steps (Table 4), 500 of them warm-up
        **transfer_profiles(pos_encoding.ABLATION, "cifar10",
                            {**FINE_TUNE, **NO_MIX, "data.img_size": 64, "data.batch_size": 512,
                             "model.warmup_epochs": 5, "trainer.max_epochs": 100}, "CIFAR-10 32 px -> 64 px, ViT-S/4"),
        # 2,500 steps an epoch at batch 512: 20,000 steps (Table 4), 500 of them warm-up
        **transfer_profiles(pos_encoding.ABLATION, "imagenet",
                            {**FINE_TUNE, **NO_MIX, "data.img_size": 384, "data.batch_size": 512,
                             "model.warmup_epochs": 0.2, "trainer.max_epochs": 8}, "ImageNet 224 px -> 384 px, ViT-B/16"),
    },
)
