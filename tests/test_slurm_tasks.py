"""The allocation's task layout against fit's devices, without a scheduler: the one-line advice it gives."""

from vit_lightning.run.slurm_tasks import task_error

BATCH = {"SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1"}  # a job script's own shell


def test_two_devices_in_a_one_task_job_without_srun_names_every_way_out():
    error = task_error({"trainer.devices": "2", "trainer.num_nodes": 1, "trainer.accelerator": "cpu"}, BATCH)
    assert "give --trainer.devices equal to --ntasks-per-node (1)" in error
    assert "start fit with srun and --ntasks-per-node=2" in error
    assert "drop --ntasks-per-node so that Lightning starts the 2 processes itself" in error


def test_more_tasks_than_devices_is_told_to_match_them_only():
    env = {**BATCH, "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}
    error = task_error({"trainer.devices": "1", "trainer.num_nodes": 1, "trainer.accelerator": "cpu"}, env)
    assert "give --trainer.devices equal to --ntasks-per-node (2)" in error and "srun" not in error


def test_a_matching_layout_and_no_allocation_pass():
    env = {**BATCH, "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}
    assert task_error({"trainer.devices": "2", "trainer.num_nodes": 1, "trainer.accelerator": "cpu"}, env) is None
    assert task_error({"trainer.devices": "2"}, {}) is None
