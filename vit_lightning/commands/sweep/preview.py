"""`vit-ablate sweep --dry-run`: how many trials, where their records go, and each trial's state; the command line
of each trial still to run and of each evaluation its profile declares after it (the lines not starting with `#` are
exactly what the sweep would run); the profile's projected time where it states one."""

from __future__ import annotations

import shlex

from vit_lightning.commands.sweep.local import State, status_of, to_evaluate
from vit_lightning.commands.sweep.trials import Trial

RETRY = "--retry-failed runs it again"


def trial_states(trials: list[Trial], retry_failed: bool) -> list[str]:
    """Each trial's state as the sweep would find it now: done, failed (not retried) or to run."""
    state = State(log=lambda _: None)  # a damaged state is named once, by repair.check
    return [{"done": "done", "failed": "failed"}.get(status_of(t, state, retry_failed), "to run") for t in trials]


def lines(trials: list[Trial], retry_failed: bool) -> list[str]:
    """The count, the output folder(s) and the state of every trial; the command of each trial to run."""
    if not trials:
        return []
    states = trial_states(trials, retry_failed)
    folders = sorted({str(t.record_dir) for t in trials})
    counts = ", ".join(f"{states.count(s)} {s}" for s in ("done", "to run", "failed"))
    evaluations = sum(len(t.evaluations) for t in trials)
    out = [f"# {len(trials)} trials, records in {', '.join(folders)}: {counts}"
           + (f"; {evaluations} evaluations declared after them" if evaluations else "")]
    read = State(log=lambda _: None)
    for trial, state in zip(trials, states):
        if state == "to run":
            out += [trial.shell(), *map(shlex.join, trial.evaluations)]
        else:
            out.append(f"# {state}: {trial.id}" + (f" ({RETRY})" if state == "failed" else ""))
            out += map(shlex.join, to_evaluate(trial, read) if state == "done" else ())
    return out
