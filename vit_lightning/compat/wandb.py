"""What W&B's environment says (WANDB_MODE, credentials), read once here for fit, the sweep and viz.

The credential check uses wandb's private settings and netrc reader (wandb < 0.32, pyproject.toml).
A light module: the sweep command checks credentials without importing Lightning.
"""

from __future__ import annotations

import os


def env_mode() -> str | None:
    """What WANDB_MODE asks for: "disabled", "offline" (also its old name dryrun), "online", or None when unset."""
    value = os.environ.get("WANDB_MODE")
    return {"dryrun": "offline", "run": "online"}.get(value, value) if value else None


def credentials() -> bool:
    """W&B can log in without asking, as wandb itself resolves it.

    Private: wandb has no public "would login succeed without a prompt" call (`wandb.login()` prompts or
    contacts the server); its own settings resolution and netrc reader answer it offline.

    WANDB_API_KEY (or an identity token), else a netrc entry for the server wandb talks to: WANDB_BASE_URL,
    else the base_url that `wandb login --host URL` saved in wandb's settings file (self-hosted W&B).
    """
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    settings = wandb_setup.singleton().settings  # env, then wandb's settings files, as wandb.init reads them
    if settings.api_key or settings.identity_token_file:
        return True
    try:
        return wbauth.read_netrc_auth(host=settings.base_url) is not None
    except Exception:  # a malformed entry: wandb says what is wrong with it when it logs in
        return False
