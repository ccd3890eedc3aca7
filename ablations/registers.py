"""Register tokens: "Vision Transformers Need Registers" (Darcet et al., ICLR 2024); ours, on this paper's ViT.

Large ViTs trained long (DINOv2, OpenCLIP, DeiT-III) re-use a few low-information patch tokens as scratch
space: those tokens' outputs grow to about ten times the norm of the others and the attention maps focus on
them. A few extra learned tokens, registers, placed after the [class] token with no position and left out of
the pooling, take that role, and the artifacts disappear. Accuracy barely moves: DINOv2 ImageNet linear
without vs with 4 registers, ViT-S 81.1 / 80.9, B 84.5 / 84.6, L 86.3 / 86.7, g 86.5 / 87.1 (their Table 2).
So the table shows, beside accuracy, what `vit-ablate viz RUN --into-record` measures on 32 validation images:
the fraction of patch tokens whose output norm exceeds 4x its image's median (viz/analysis.HIGH_NORM) and the
mean entropy of the patch queries' attention, at each quarter of the depth (every layer of the 4-block demo).
Expected: without registers, high-norm tokens appear only in large models after long training (the paper
sees none in small ones); the demo's micro ViT should show none, and the table says so when it does not.

Run:  vit-ablate sweep registers                       # demo: mnist5k, micro ViT/7, 0 / 1 / 4 registers, CPU
      for run in runs/registers/demo/*/; do vit-ablate viz "$run" --into-record; done
      vit-ablate table registers
      vit-ablate sweep registers --profile cifar10     # ViT-S/4 (then viz and table --profile cifar10)
"""

from vit_lightning.ablation import METRIC, Ablation, profile

REG = "model.reg_tokens"
COUNTS = [0, 1, 4]
QUARTERS = {1: "L/4", 2: "L/2", 3: "3L/4", 4: "L"}  # the layers viz records (viz/run.py QUARTERS)

ABLATION = Ablation(
    name="registers",
    naming=1,  # the naming rule its committed runs were named by: their names and sweep YAMLs stay
    title="Register tokens: accuracy, high-norm tokens and attention entropy",
    source="Darcet et al. 2024, Table 2 and Figures 3-4; ours",
    finding="Registers leave accuracy about unchanged and take away the high-norm patch tokens of large ViTs.",
    metric=METRIC,
    rows=REG,
    cols=None,
    columns={**{f"viz/high_norm_q{q}": f"high-norm tokens, layer {at}" for q, at in QUARTERS.items()},
             **{f"viz/attn_entropy_q{q}": f"attention entropy (nats), layer {at}" for q, at in QUARTERS.items()}},
    reference={0: 0.811, 4: 0.809},
    reference_note="DINOv2 ViT-S/14 without and with 4 registers, ImageNet linear probe (Darcet et al., Table 2): "
                   "self-supervised, not comparable in level to a supervised run",
    profiles={
        name: profile(name, {REG: COUNTS}, description=desc)
        for name, desc in [
            ("demo", "mnist5k, micro ViT/7, CPU"),
            ("cifar10", "CIFAR-10, ViT-S/4"),
            ("imagenet", "ImageNet, ViT-B/16"),
        ]
    },
)
