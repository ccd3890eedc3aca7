"""A training step reads nothing back from the device: no host sync outside the steps Lightning writes out."""

import pytest
import torch
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train
from vit_lightning.run.module import Classifier

# Python-level calls that wait for the device (a value read back, a size known only after the kernel ran)
# or copy host values to it (a tensor made from Python numbers: on a GPU a synchronous host-to-device copy)
SYNCING = [(torch.Tensor, name) for name in ("item", "tolist", "__bool__", "__float__", "__int__", "new_tensor",
                                             "nonzero", "cpu", "numpy")] + [(torch, "unique"), (torch, "tensor"),
                                                                           (torch, "nonzero")]


class Syncs:
    """Within the with-block, every call of a SYNCING function is noted by name."""

    def __init__(self):
        self.calls: list[str] = []
        self._saved = []

    def __enter__(self):
        for owner, name in SYNCING:
            real = getattr(owner, name)
            self._saved.append((owner, name, real))
            setattr(owner, name, self._noting(name, real))
        return self

    def _noting(self, name, real):
        def call(*args, **kwargs):
            self.calls.append(name)
            return real(*args, **kwargs)
        return call

    def __exit__(self, *exc):
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)


@pytest.mark.slow
def test_a_training_step_that_logs_nothing_syncs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real, steps = Classifier.training_step, []

    def watched(self, batch, batch_idx):
        writes = (self.global_step + 1) % self.trainer.log_every_n_steps == 0 or self.trainer.is_last_batch
        with Syncs() as syncs:
            out = real(self, batch, batch_idx)
        steps.append((writes, syncs.calls))
        return out

    monkeypatch.setattr(Classifier, "training_step", watched)
    argv = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=1",
            "--trainer.log_every_n_steps=4", "--run.fewshot_shots=[]", "--run.shuffle_perms=0",
            f"--run.root={tmp_path}"]
    assert train.main(argv) == 0
    assert [writes for writes, _ in steps] == [False, False, False, True, False, True]  # step 4 logs, 6 ends the epoch
    assert [calls for writes, calls in steps if not writes] == [[]] * 4
    assert any(calls for writes, calls in steps if writes)  # the detector sees the syncs that are there
