"""Where the package reaches into another library's private API: one module per library, each use saying why.

Nothing else in vit_lightning touches a private attribute of torch, torchvision or Lightning (wandb's
two private calls live with every other wandb call, in loggers.py). Each of these libraries has an
upper bound in pyproject.toml, so a release that moves such an attribute cannot arrive unnoticed.
"""
