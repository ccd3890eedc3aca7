"""The suite's markers mean what they say: conftest fails a test that trains without `slow` (two DDP processes: `ddp`)."""

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent
INNER = '''
import contextlib
import subprocess
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest


def test_fit_in_a_subprocess_unmarked():
    subprocess.run(["echo", "vit-ablate", "fit", "--model.variant=micro"], check=True)


@pytest.mark.slow
def test_fit_in_a_subprocess_marked():
    subprocess.run(["echo", "vit-ablate", "fit", "--model.variant=micro"], check=True)


def test_help_is_no_training():
    subprocess.run(["echo", "vit-ablate", "fit", "--help"], check=True)


def test_a_sweep_of_the_stand_in_fit_is_no_training(stand_in):
    subprocess.run(["echo", "vit-ablate", "sweep", "fake.yaml"], check=True)


@pytest.mark.slow
def test_two_processes_without_ddp():
    subprocess.run("echo vit-ablate sweep x --trainer.devices=2", shell=True, check=True)


@pytest.mark.slow
def test_trainer_fit_in_this_process_with_two_ranks():
    with contextlib.suppress(Exception):  # the stand-in trainer is no trainer: only the call counts here
        pl.Trainer.fit(SimpleNamespace(world_size=2), None)


def test_trainer_fit_in_this_process_unmarked():
    with contextlib.suppress(Exception):
        pl.Trainer.fit(SimpleNamespace(world_size=1), None)
'''


def test_a_test_that_trains_without_its_marks_fails(tmp_path):
    for name in ("conftest.py", "tiny.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_inner.py").write_text(INNER)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-W", "ignore::pytest.PytestUnknownMarkWarning", "test_inner.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=200)
    status = {line.split()[1].split("::")[1]: line.split()[0] for line in done.stdout.splitlines()
              if line.startswith(("PASSED", "FAILED"))}
    assert status == {"test_fit_in_a_subprocess_unmarked": "FAILED", "test_fit_in_a_subprocess_marked": "PASSED",
                      "test_help_is_no_training": "PASSED", "test_two_processes_without_ddp": "FAILED",
                      "test_a_sweep_of_the_stand_in_fit_is_no_training": "PASSED",
                      "test_trainer_fit_in_this_process_with_two_ranks": "FAILED",
                      "test_trainer_fit_in_this_process_unmarked": "FAILED"}, done.stdout[-3000:]
    slow, ddp = "mark it @pytest.mark.slow", "mark it @pytest.mark.ddp"
    sections = done.stdout.split("short test summary info")[0]  # the summary repeats them, untruncated under CI=true
    assert sections.count(slow) == 2 and sections.count(ddp) == 2  # in each failing test's section
