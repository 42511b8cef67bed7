"""`srun keras-scaling doctor` on the throw-away Slurm cluster: 2 tasks, no TF_CONFIG.

The doctor runs the way training runs: each task of one job step builds the
cluster from Slurm's variables, says where it came from, and passes every
check through the strategy's collectives.
"""

import re

import pytest
from common import REPO, job_env, read, write_script

JOB_TIMEOUT_S = 300
CHECK_NAMES = {"versions", "devices", "all-reduce", "first collective", "bandwidth", "server"}

pytestmark = pytest.mark.timeout(2 * JOB_TIMEOUT_S)


@pytest.fixture(scope="module")
def doctor_job(slurm, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("doctor")
    script = write_script(
        tmp_path / "doctor.sbatch",
        "#SBATCH --ntasks=2\n"
        'srun --label "$PYTHON" -m keras_scaling doctor --cpu-devices 2 --size-mb 1 --rounds 1\n',
    )
    output = tmp_path / "doctor.out"
    job_id = slurm.sbatch(["--output", str(output), "--chdir", REPO, script], env=job_env())
    fields = slurm.wait_for_job(job_id, JOB_TIMEOUT_S)
    return fields, read(output), job_id


def _task_output(output, task):
    # srun --label prefixes each line with "<task>: ".
    prefix = re.compile(rf"^ *{task}: ", re.M)
    return "\n".join(prefix.sub("", line) for line in output.splitlines() if prefix.match(line))


def test_srun_doctor_passes_every_check_on_both_tasks(doctor_job):
    fields, output, _ = doctor_job
    assert fields["JobState"] == "COMPLETED", output[-6000:]
    for task in (0, 1):
        lines = _task_output(output, task)
        found = dict(
            (name, status) for status, name in re.findall(r"^(ok|FAIL) +([a-z -]+):", lines, re.M)
        )
        assert found == {name: "ok" for name in CHECK_NAMES}, lines
        assert f"this is worker {task} of 2" in lines
        assert "devices: 2 workers, 2 CPU replicas each: 4 replicas in all" in lines
        # 2 tasks x 2 logical CPUs, each replica r sending r + 1: 1 + 2 + 3 + 4.
        assert "summing r + 1 over 4 replicas gave 10 " in lines


def test_srun_doctor_says_the_cluster_came_from_the_slurm_step(doctor_job):
    fields, output, job_id = doctor_job
    for task in (0, 1):
        lines = _task_output(output, task)
        assert f"cluster: Slurm job {job_id} step 0: 2 tasks on 1 node" in lines, lines
        assert "TF_CONFIG is not set" in lines
