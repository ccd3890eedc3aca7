"""model.compile pays in a fit: one graph for training and one for evaluation, no recompile across steps and epochs."""

import functools
import logging

import pytest
import torch
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train

pytestmark = pytest.mark.slow  # trains


class Recompiles(logging.Handler):
    """The recompile reasons dynamo logs (torch._logging's `recompiles` artifact)."""

    def __init__(self):
        super().__init__()
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.append(record.getMessage())


@pytest.fixture
def recompiles():
    torch._dynamo.reset()
    torch._logging.set_logs(recompiles=True)
    handler = Recompiles()
    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    torch._logging.set_logs()
    torch._dynamo.reset()


def test_a_compiled_fit_compiles_once_for_training_and_once_for_validation(tmp_path, monkeypatch, recompiles,
                                                                            only_record):
    # aot_eager: dynamo and AOTAutograd as inductor gets them, without inductor's minutes of C++ builds on a CPU
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.chdir(tmp_path)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    # 50 training images of mnist5k, half held out for validation: both splits end on a short batch (25 = 16 + 9),
    # and device-side augmentation feeds the model as a GPU trial would
    argv = [*TINY_MODEL, "--trainer.num_sanity_val_steps=1", "--data.val_split=0.99", "--data.holdout=0.5",
            "--data.random_crop=true", "--data.augment_on=device", "--trainer.max_epochs=2", "--model.compile=true",
            "--run.fewshot_shots=[]", "--run.shuffle_perms=0", f"--run.root={tmp_path / 'runs'}"]
    assert train.main(argv) == 0
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "completed" and len(record["history"]) == 2
    assert recompiles.reasons == []  # no guard failed: not the mode switch, the last batch, nor a new epoch
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2  # training and evaluation
    assert record["compute"]["compile_s"] > 0
    assert (record["compute"]["augment_on"], record["compute"]["loader_workers"]) == ("device", 0)
