"""The cluster's resolution from environment variables: Slurm, Kubernetes, TF_CONFIG.

Plain functions of dicts of environment variables: no TensorFlow, no Slurm
daemons (tests/cluster/ compares the pure-Python host-list expander with
`scontrol show hostnames` on a real Slurm).
"""

import json

import pytest

from keras_scaling import cluster
from keras_scaling.cluster._hostlist import expand_hostlist_python
from keras_scaling.launch._environment import LAUNCHED_ENV


def _step_env(**overrides):
    """The variables `srun -n 4` on 2 nodes gives task 3 (gpu02, local rank 1)."""
    env = {
        "SLURM_JOB_ID": "1234",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURMD_NODENAME": "gpu02",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_PROCID": "3",
    }
    env.update(overrides)
    return {key: value for key, value in env.items() if value is not None}


def _pure(text, parameter="host list"):
    return expand_hostlist_python(text, parameter)


# -- host lists -------------------------------------------------------------


def test_hostlist_expands_ranges_and_keeps_zero_padding():
    assert _pure("gpu[01-04,07]") == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]


def test_hostlist_expands_entries_with_and_without_brackets_in_order():
    assert _pure("node[1-2],login3") == ["node1", "node2", "login3"]


def test_hostlist_multiplies_several_bracket_groups():
    assert _pure("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]


def test_hostlist_keeps_text_after_a_bracket_group():
    assert _pure("train-[0-2].train-svc:2222") == [
        "train-0.train-svc:2222",
        "train-1.train-svc:2222",
        "train-2.train-svc:2222",
    ]


@pytest.mark.parametrize("text", ["node[1", "node1]", "node[1-x]", "node[3-1]", "a,,b", ""])
def test_hostlist_rejects_malformed_lists_naming_the_parameter(text):
    with pytest.raises(ValueError, match="SLURM_STEP_NODELIST"):
        cluster.expand_hostlist(text, "SLURM_STEP_NODELIST")


# -- tasks per node ---------------------------------------------------------


def test_tasks_per_node_expands_repeat_counts():
    assert cluster.parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


def test_tasks_per_node_reads_a_plain_count():
    assert cluster.parse_tasks_per_node("4") == [4]


@pytest.mark.parametrize("text", ["2(3)", "x", "2(x3", ""])
def test_tasks_per_node_rejects_other_forms(text):
    with pytest.raises(ValueError, match="SLURM_STEP_TASKS_PER_NODE"):
        cluster.parse_tasks_per_node(text)


# -- Slurm steps ------------------------------------------------------------


def test_slurm_step_lists_one_worker_per_task_node_by_node():
    spec = cluster.slurm_cluster(_step_env(), expand=_pure)
    base = cluster.step_port_base(1234, 0, 2)
    assert spec.workers == (
        f"gpu01:{base}",
        f"gpu01:{base + 1}",
        f"gpu02:{base}",
        f"gpu02:{base + 1}",
    )


def test_slurm_task_index_comes_from_node_and_local_rank():
    spec = cluster.slurm_cluster(_step_env(), expand=_pure)
    assert (spec.task_type, spec.task_index, spec.local_rank) == ("worker", 3, 1)


def test_slurm_task_index_ignores_a_cyclic_procid():
    # --distribution=cyclic puts rank 1 on the second node; the worker list is
    # node by node, so the index follows the node and local rank.
    env = _step_env(SLURMD_NODENAME="gpu02", SLURM_LOCALID="0", SLURM_PROCID="1")
    assert cluster.slurm_cluster(env, expand=_pure).task_index == 2


def test_slurm_uneven_tasks_per_node():
    env = _step_env(
        SLURM_STEP_NUM_TASKS="7",
        SLURM_STEP_NODELIST="gpu[01-03,07]",
        SLURM_STEP_TASKS_PER_NODE="2(x3),1",
        SLURMD_NODENAME="gpu07",
        SLURM_LOCALID="0",
    )
    spec = cluster.slurm_cluster(env, expand=_pure)
    assert [address.split(":")[0] for address in spec.workers] == [
        "gpu01",
        "gpu01",
        "gpu02",
        "gpu02",
        "gpu03",
        "gpu03",
        "gpu07",
    ]
    assert spec.task_index == 6


def test_slurm_origin_names_job_step_tasks_and_nodes():
    spec = cluster.slurm_cluster(_step_env(), expand=_pure)
    assert spec.origin == "Slurm job 1234 step 0: 4 tasks on 2 nodes"


def test_slurm_ports_of_a_node_are_distinct_and_the_same_on_every_task():
    specs = [
        cluster.slurm_cluster(
            _step_env(SLURMD_NODENAME=node, SLURM_LOCALID=str(rank)), expand=_pure
        )
        for node in ("gpu01", "gpu02")
        for rank in (0, 1)
    ]
    assert len({spec.workers for spec in specs}) == 1
    assert len(set(specs[0].workers)) == 4
    assert [spec.task_index for spec in specs] == [0, 1, 2, 3]


def test_slurm_ports_differ_between_neighbouring_jobs_and_steps():
    bases = {cluster.step_port_base(job, step) for job in range(1000, 1100) for step in (0, 1)}
    assert len(bases) == 200
    for base in bases:
        assert 20000 <= base and base + 32 <= 32768


def test_slurm_port_env_var_overrides_the_derived_ports():
    spec = cluster.slurm_cluster(_step_env(KERAS_SCALING_PORT="41000"), expand=_pure)
    assert spec.workers[:2] == ("gpu01:41000", "gpu01:41001")


def test_slurm_port_env_var_rejects_a_privileged_port():
    with pytest.raises(ValueError, match="KERAS_SCALING_PORT"):
        cluster.slurm_cluster(_step_env(KERAS_SCALING_PORT="80"), expand=_pure)


def test_slurm_step_of_one_task_is_no_cluster():
    env = _step_env(
        SLURM_NTASKS="1",
        SLURM_STEP_NUM_TASKS="1",
        SLURM_STEP_NODELIST="gpu01",
        SLURM_STEP_TASKS_PER_NODE="1",
        SLURMD_NODENAME="gpu01",
        SLURM_LOCALID="0",
    )
    assert cluster.slurm_cluster(env, expand=_pure) is None


def test_outside_slurm_is_no_cluster():
    assert cluster.slurm_cluster({}, expand=_pure) is None


def test_batch_script_running_python_directly_on_several_tasks_names_srun():
    # What an sbatch --ntasks=2 script sees without srun: no step id.
    env = _step_env(SLURM_STEP_ID=None, SLURM_PROCID="0", SLURM_LOCALID="0")
    with pytest.raises(cluster.NotInStepError, match="srun python train.py"):
        cluster.slurm_cluster(env, expand=_pure)


def test_batch_script_of_one_task_is_no_cluster():
    env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "gpu01"}
    assert cluster.slurm_cluster(env, expand=_pure) is None


def test_slurm_variables_that_disagree_are_named():
    env = _step_env(SLURM_STEP_TASKS_PER_NODE="2(x3)")
    with pytest.raises(ValueError, match="does not match"):
        cluster.slurm_cluster(env, expand=_pure)


# -- GPUs per task ----------------------------------------------------------


def test_gpus_bound_per_task_by_slurm_are_kept():
    env = {"SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "3"}
    assert cluster.task_gpus(env, local_rank=1, tasks_on_node=2) is None


def test_gpus_shared_by_the_tasks_of_a_node_are_split_by_local_rank():
    env = {"SLURM_STEP_GPUS": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert cluster.task_gpus(env, local_rank=0, tasks_on_node=2) == ["4", "5"]
    assert cluster.task_gpus(env, local_rank=1, tasks_on_node=2) == ["6", "7"]


def test_gpu_count_alone_is_split_by_local_rank():
    env = {"SLURM_GPUS_ON_NODE": "4"}
    assert cluster.task_gpus(env, local_rank=3, tasks_on_node=4) == ["3"]


def test_node_without_gpus_leaves_devices_alone():
    assert cluster.task_gpus({}, local_rank=1, tasks_on_node=2) is None
    assert cluster.task_gpus({"CUDA_VISIBLE_DEVICES": ""}, 1, 2) is None


def test_gpus_that_do_not_divide_among_tasks_name_the_fix():
    with pytest.raises(ValueError, match="--gpus-per-task"):
        cluster.task_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, local_rank=0, tasks_on_node=2)


# -- Kubernetes -------------------------------------------------------------


def test_worker_hosts_template_with_the_pod_index():
    env = {"KERAS_SCALING_WORKER_HOSTS": "train-[0-3].train-svc:2222", "JOB_COMPLETION_INDEX": "2"}
    spec = cluster.worker_hosts_cluster(env)
    assert spec.workers == tuple(f"train-{i}.train-svc:2222" for i in range(4))
    assert (spec.task_type, spec.task_index) == ("worker", 2)
    assert spec.origin == "Kubernetes indexed job, pod 2 of 4 (KERAS_SCALING_WORKER_HOSTS)"


def test_worker_hosts_comma_list():
    env = {"KERAS_SCALING_WORKER_HOSTS": "a:1,b:2", "JOB_COMPLETION_INDEX": "1"}
    assert cluster.worker_hosts_cluster(env).tf_config() == {
        "cluster": {"worker": ["a:1", "b:2"]},
        "task": {"type": "worker", "index": 1},
    }


def test_worker_hosts_without_index_names_the_indexed_job():
    with pytest.raises(ValueError, match="completionMode: Indexed"):
        cluster.worker_hosts_cluster({"KERAS_SCALING_WORKER_HOSTS": "a:1,b:2"})


def test_worker_hosts_index_beyond_the_list_names_completions():
    env = {"KERAS_SCALING_WORKER_HOSTS": "w-[0-1]:2222", "JOB_COMPLETION_INDEX": "2"}
    with pytest.raises(ValueError, match="completions"):
        cluster.worker_hosts_cluster(env)


def test_worker_hosts_entry_without_port_is_refused():
    env = {"KERAS_SCALING_WORKER_HOSTS": "w-[0-1].svc", "JOB_COMPLETION_INDEX": "0"}
    with pytest.raises(ValueError, match="host:port"):
        cluster.worker_hosts_cluster(env)


# -- TF_CONFIG and precedence -----------------------------------------------


def _tf_config(task_type, index):
    return json.dumps(
        {
            "cluster": {
                "chief": ["chief-0:2222"],
                "worker": ["worker-0:2222", "worker-1:2222"],
                "evaluator": ["evaluator-0:2222"],
            },
            "task": {"type": task_type, "index": index},
        }
    )


def test_tf_config_of_vertex_counts_the_chief_as_a_worker():
    spec = cluster.tf_config_cluster({"TF_CONFIG": _tf_config("worker", 1)})
    assert spec.num_workers == 3
    assert spec.origin == "TF_CONFIG: 1 chief, 2 workers, 1 evaluator; this is worker 1"


def test_tf_config_evaluator_task_is_read():
    spec = cluster.tf_config_cluster({"TF_CONFIG": _tf_config("evaluator", 0)})
    assert (spec.task_type, spec.address) == ("evaluator", "evaluator-0:2222")


def test_tf_config_task_outside_its_cluster_is_refused():
    with pytest.raises(ValueError, match="has 2 worker"):
        cluster.tf_config_cluster({"TF_CONFIG": _tf_config("worker", 2)})


def test_tf_config_set_by_launch_says_so():
    config = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker"}}
    env = {"TF_CONFIG": json.dumps(config), LAUNCHED_ENV: "1"}
    assert cluster.resolve_cluster(env).origin.endswith("set by keras-scaling launch")
    assert cluster.resolve_cluster(env).source == "launch"


def test_tf_config_wins_over_a_slurm_step_and_says_so():
    env = _step_env(TF_CONFIG=_tf_config("chief", 0))
    spec = cluster.resolve_cluster(env, expand=_pure)
    assert spec.source == "tf_config"
    assert spec.origin.endswith("(it wins over Slurm job 1234 step 0: 4 tasks on 2 nodes)")


def test_tf_config_spares_a_batch_script_the_not_in_step_error():
    env = _step_env(SLURM_STEP_ID=None, TF_CONFIG=_tf_config("worker", 0))
    assert cluster.resolve_cluster(env, expand=_pure).source == "tf_config"


def test_worker_hosts_win_over_a_slurm_step():
    env = _step_env(KERAS_SCALING_WORKER_HOSTS="a:1,b:2", JOB_COMPLETION_INDEX="0")
    assert cluster.resolve_cluster(env, expand=_pure).source == "kubernetes"


def test_one_process_has_no_cluster():
    assert cluster.resolve_cluster({}) is None
    assert cluster.describe_cluster({}).startswith("one process")
