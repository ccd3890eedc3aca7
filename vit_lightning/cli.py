"""The `vit-ablate` command: one entry point, one module per subcommand."""

from __future__ import annotations

import importlib
import sys

from vit_lightning.model.family import FAMILIES

# subcommand -> ("module:function", one-line help); the function takes argv and returns an exit code
COMMANDS = {
    "fit": ("vit_lightning.commands.fit.main:main", "train one run (LightningCLI: --model.*, --data.*, --trainer.*)"),
    "sweep": ("vit_lightning.commands.sweep.cli:main", "run an ablation's sweep locally or on W&B agents"),
    "sweeps": ("vit_lightning.commands.sweep.cli:write_main", "regenerate sweeps/*.yaml from ablations/"),
    "table": ("vit_lightning.commands.results.cli:main", "regenerate an ablation's tables and plots from run records"),
    "viz": ("vit_lightning.commands.viz.cli:main", "the paper's analysis figures (attention, position embeddings) of a run"),
    "fewshot": ("vit_lightning.analysis.fewshot:main", "few-shot linear accuracy of a finished run, into its record"),
    "eval": ("vit_lightning.analysis.evaluate:main", "top-1, top-5, loss and few-shot of a run or timm model on any data"),
    "reproduce": ("vit_lightning.commands.reproduce.cli:main", "a published table measured again (rope_vit: RoPE-ViT's "
                  "resolution table on your ImageNet validation folder)"),
    "bench": ("vit_lightning.commands.bench.cli:main", "training step vs timm and the matmul peak; loader throughput"),
    "gpu-check": ("vit_lightning.commands.bench.gpu_check:main", "one short run that proves a GPU machine (--dry-run: CPU)"),
    "names": ("vit_lightning.commands.sweep.names:main", "check run names against their naming rule (--migrate: add its version)"),
    "docs": ("vit_lightning.commands.docs.pages:main",
             "regenerate docs/reference/ from the registries (--check: exit 1 if stale)"),
}


def usage() -> str:
    lines = ["usage: vit-ablate COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`vit-ablate COMMAND --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"vit-ablate: unknown command {command!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:  # the first read of the families loads those of entry points: a bad one is one line, before any command
        len(FAMILIES)
    except ValueError as error:
        print(f"vit-ablate: error: {error}", file=sys.stderr)
        return 2
    module_name, function = COMMANDS[command][0].split(":")
    return int(getattr(importlib.import_module(module_name), function)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
