"""The run directory's vocabulary: record and checkpoint names, metric keys, statuses, environment names."""

from __future__ import annotations

RUN_DEFAULTS = {"run.root": "runs", "run.ablation": "adhoc", "run.profile": "local"}  # fit's --run.* defaults
# The run directory's vocabulary: every module names these files and keys through here.
RECORD = "results.json"  # a run's record, in its run directory
LAST_CKPT = "last.ckpt"  # the run's one checkpoint, overwritten every epoch: resume point and final weights
SEED_KEY = "seed_everything"  # the seed's option name (a sweep key, a record config key)
BEST_METRIC = "val/acc_best"  # the best epoch's validation accuracy: the sweeps' metric and the tables' value
SHUFFLED_ACC = "val/acc_shuffled"  # top-1 of the final weights with each image's patches permuted (shuffle.py)
SHUFFLE_DROP = "val/shuffle_drop"  # top-1 on intact images minus SHUFFLED_ACC: how much the model uses position
FINAL = ("completed", "diverged", "stopped_early")  # record statuses that end a run: a re-run skips it unless asked to retrain
# stopped_early: a sweep's hyperband rule stopped it (hyperband.py); its record says why in `stopped_early`
SWEEP_PID_ENV = "VIT_ABLATE_SWEEP_PID"  # a sweep's trial stops itself once this process is gone
GRACE_ENV = "VIT_ABLATE_STOP_GRACE_S"  # seconds a stopped trial gets before SIGKILL (default 60)
# a sweep slot's share of the machine's CPUs for loader workers: a trial uses at most this many (data.num_workers)
WORKERS_ENV = "VIT_ABLATE_LOADER_WORKERS"
SUMMARY_FIELDS = ("status", "trial", "started_at", "finished_at", "error")  # record fields mirrored into the W&B summary
# after a record's `versions.commit` hash: the code it ran differed from that commit (uncommitted edits, new files)
COMMIT_CHANGED = "+changes"
