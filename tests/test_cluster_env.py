"""The cluster's resolution from environment variables: Slurm, Kubernetes, TF_CONFIG.

Plain functions of dicts of environment variables: no TensorFlow, no Slurm
daemons (tests/cluster/ compares the pure-Python host-list expander with
`scontrol show hostnames` on a real Slurm).
"""

import itertools
import json
import shutil
import subprocess

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


def test_hostlist_of_three_groups_varies_the_last_fastest_then_the_first():
    # What `scontrol show hostnames` (Slurm 22.05) answers.
    assert _pure("a[1-2]b[1-2]c[1-2]") == [
        "a1b1c1",
        "a1b1c2",
        "a2b1c1",
        "a2b1c2",
        "a1b2c1",
        "a1b2c2",
        "a2b2c1",
        "a2b2c2",
    ]


def test_hostlist_of_four_groups_follows_scontrols_order():
    hosts = _pure("a[1-2]b[3-4]c[5-6]d[7-8]")
    assert hosts[:8] == [
        "a1b3c5d7",
        "a1b3c5d8",
        "a2b3c5d7",
        "a2b3c5d8",
        "a1b4c5d7",
        "a1b4c5d8",
        "a2b4c5d7",
        "a2b4c5d8",
    ]
    assert hosts[8] == "a1b3c6d7"
    assert len(set(hosts)) == 16


@pytest.mark.parametrize(
    "text", ["n1 n2 login3", "n1,n2,login3", "n1, n2 ,login3", "n[1-2]\n login3"]
)
def test_hostlist_entries_separated_by_spaces_commas_or_both(text):
    assert _pure(text) == ["n1", "n2", "login3"]


def test_hostlist_keeps_a_bracketed_ipv6_address():
    assert _pure("[fd00::1]:2222 [fd00::2]:[2222-2223]") == [
        "[fd00::1]:2222",
        "[fd00::2]:2222",
        "[fd00::2]:2223",
    ]


def test_hostlist_bracket_with_a_colon_that_is_no_ipv6_address_is_refused():
    with pytest.raises(ValueError, match="nor an IPv6 address"):
        _pure("[fd00:zz]:2222")


@pytest.mark.parametrize(
    "text", ["node[1", "node1]", "node[1-x]", "node[3-1]", "a,,b", ",a", "a,", ""]
)
def test_hostlist_rejects_malformed_lists_naming_the_parameter(text):
    with pytest.raises(ValueError, match="SLURM_STEP_NODELIST"):
        cluster.expand_hostlist(text, "SLURM_STEP_NODELIST")


def _generated_host_lists():
    """Entries of 1 to 5 bracket groups (ranges, lists, zero padding) in three shapes."""
    ranges = ["1-2", "1,3", "01-03", "8-10", "5"]
    lists = []
    for groups in range(1, 6):
        for first in range(len(ranges)):
            picked = [ranges[(first + k) % len(ranges)] for k in range(groups)]
            lists.append("".join(f"{'xyzwv'[k]}[{part}]" for k, part in enumerate(picked)))
            lists.append("".join(f"{'_yzwv'[k]}[{part}]" for k, part in enumerate(picked))[1:])
            lists.append(".".join(f"r{k}-[{part}]" for k, part in enumerate(picked)))
    # Several entries in one list, separated as Slurm separates them.
    lists.append(f"{lists[20]} {lists[31]},{lists[45]}\t{lists[60]} , login3")
    return lists


@pytest.fixture(scope="module")
def scontrol_conf(tmp_path_factory):
    """A slurm.conf enough for `scontrol show hostnames`, which needs no controller."""
    if shutil.which("scontrol") is None:
        pytest.skip("Slurm's scontrol is not installed (make test-cluster installs it)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text(
        "ClusterName=hostlists\nSlurmctldHost=localhost(127.0.0.1)\n"
        "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=localhost Default=YES\n"
    )
    return str(conf)


def test_python_host_list_expander_agrees_with_scontrol(scontrol_conf, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", scontrol_conf)
    lists = _generated_host_lists()
    assert any(text.count("[") >= 3 for text in lists)
    for text in lists:
        result = subprocess.run(
            ["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=30
        )
        assert result.stderr == "", (text, result.stderr)
        assert _pure(text) == result.stdout.split(), text
        # And expand_hostlist answers the same with scontrol as without.
        assert cluster.expand_hostlist(text) == cluster.expand_hostlist(text, use_scontrol=False)


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
        assert 20000 <= base < 32768


def _step_ports(job, step, tasks_on_node):
    base = cluster.step_port_base(job, step, tasks_on_node)
    return range(base, base + tasks_on_node)


def _jobs_sharing_a_port(job_ids, tasks_on_node):
    """{port: [(job, step), ...]} over steps 0 to 7 of the jobs, for ports used twice."""
    users = {}
    for job in job_ids:
        for step in range(8):
            for port in _step_ports(job, step, tasks_on_node):
                users.setdefault(port, []).append((job, step))
    return {port: jobs for port, jobs in users.items() if len(jobs) > 1}


def test_slurm_ports_of_steps_0_to_7_of_jobs_within_1000_ids_never_coincide():
    # Every job id from 0 to 20,000, against every other: a port used twice
    # is used by jobs more than 1,000 ids apart.
    shared = _jobs_sharing_a_port(range(20001), tasks_on_node=1)
    assert shared, "the range holds fewer ports than 20,001 jobs of 8 steps"
    for port, users in shared.items():
        for (job_a, step_a), (job_b, step_b) in itertools.combinations(users, 2):
            assert abs(job_a - job_b) > 1000, (port, job_a, step_a, job_b, step_b)


@pytest.mark.parametrize("tasks_on_node", [2, 4, 8])
def test_slurm_ports_of_steps_with_several_tasks_per_node_never_coincide_within_the_stated_window(
    tasks_on_node,
):
    # The guide's promise: jobs less than 12768 // (8 * tasks) ids apart.
    window = 12768 // (8 * tasks_on_node)
    shared = _jobs_sharing_a_port(range(3 * window), tasks_on_node)
    for port, users in shared.items():
        for (job_a, _), (job_b, _) in itertools.combinations(users, 2):
            assert abs(job_a - job_b) >= window, port


def test_slurm_ports_that_collided_before_are_apart():
    for job in range(5000, 5400):
        assert cluster.step_port_base(job, 1) != cluster.step_port_base(job + 131, 0)
        assert cluster.step_port_base(job, 0) != cluster.step_port_base(job + 399, 0)


@pytest.mark.parametrize("tasks_on_node", [1, 3, 8, 32])
def test_slurm_ports_stay_below_the_ephemeral_range(tasks_on_node):
    for job in range(0, 4000, 7):
        for step in range(10):
            ports = _step_ports(job, step, tasks_on_node)
            assert 20000 <= ports[0] and ports[-1] < 32768


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


def test_batch_script_of_two_nodes_without_ntasks_names_srun():
    # sbatch --nodes=2 without --ntasks: no SLURM_NTASKS, and srun would
    # start one task per node.
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "gpu[01-02]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_NODEID": "0",
    }
    with pytest.raises(cluster.NotInStepError, match="has 2 tasks.*srun python train.py"):
        cluster.slurm_cluster(env, expand=_pure)
    with pytest.raises(cluster.NotInStepError):
        cluster.resolve_cluster(env, expand=_pure)


def test_batch_script_of_one_node_without_ntasks_is_no_cluster():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "gpu01",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "1",
    }
    assert cluster.slurm_cluster(env, expand=_pure) is None


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


def _gpus_used(env, local_rank, tasks_on_node):
    """The GPUs the task trains on: task_gpus' share, or what it sees when left be."""
    gpus = cluster.task_gpus(env, local_rank, tasks_on_node)
    return gpus if gpus is not None else env.get("CUDA_VISIBLE_DEVICES", "").split(",")


@pytest.mark.parametrize("gpu_bind", [None, "single:1", "closest", "verbose,closest"])
def test_a_task_that_sees_only_its_own_gpu_keeps_it(gpu_bind):
    # srun --gpus-per-node=2 --ntasks-per-node=2 --gpu-bind=single:1 (or
    # closest): each task sees its own GPU. Given to srun, the option is not
    # in the task's environment; given to sbatch, it is.
    for rank in (0, 1):
        env = {
            "CUDA_VISIBLE_DEVICES": str(rank),
            "SLURM_STEP_GPUS": "0,1",
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_LOCALID": str(rank),
        }
        if gpu_bind is not None:
            env["SLURM_GPU_BIND"] = gpu_bind
        assert _gpus_used(env, local_rank=rank, tasks_on_node=2) == [str(rank)]


@pytest.mark.parametrize("gpu_bind", [None, "mask_gpu:0x3,0xC"])
def test_a_task_bound_to_two_gpus_by_a_mask_keeps_both(gpu_bind):
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_STEP_GPUS": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    if gpu_bind is not None:
        env["SLURM_GPU_BIND"] = gpu_bind
    assert _gpus_used(env, local_rank=1, tasks_on_node=2) == ["2", "3"]


def test_a_task_bound_by_a_map_keeps_its_gpu_even_with_a_count_alone():
    env = {"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_ON_NODE": "4", "SLURM_GPU_BIND": "map_gpu:1,3"}
    assert _gpus_used(env, local_rank=1, tasks_on_node=2) == ["3"]


def test_gpus_of_a_device_cgroup_shared_by_the_tasks_are_split_in_visible_ids():
    # ConstrainDevices: CUDA numbers the step's GPUs 4-7 from 0.
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "4,5,6,7"}
    assert _gpus_used(env, local_rank=1, tasks_on_node=2) == ["2", "3"]


def test_gpu_bind_none_shares_the_gpus_and_they_are_split():
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1", "SLURM_GPU_BIND": "none"}
    assert _gpus_used(env, local_rank=1, tasks_on_node=2) == ["1"]


def test_node_without_gpus_leaves_devices_alone():
    assert cluster.task_gpus({}, local_rank=1, tasks_on_node=2) is None
    assert cluster.task_gpus({"CUDA_VISIBLE_DEVICES": ""}, 1, 2) is None


def test_gpus_that_do_not_divide_among_tasks_name_the_fix():
    with pytest.raises(ValueError, match="--gpus-per-task"):
        cluster.task_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, local_rank=0, tasks_on_node=2)
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2", "SLURM_STEP_GPUS": "0,1,2"}
    with pytest.raises(ValueError, match="--gpus-per-task"):
        cluster.task_gpus(env, local_rank=0, tasks_on_node=2)


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


@pytest.mark.parametrize(
    "text",
    [
        "t-0.svc:2222 t-1.svc:2222",
        "t-0.svc:2222,t-1.svc:2222",
        "t-0.svc:2222, t-1.svc:2222",
        " t-0.svc:2222\n  t-1.svc:2222\n",
        "t-[0-1].svc:2222",
    ],
)
def test_worker_hosts_separated_by_spaces_commas_or_both_read_the_same_on_every_pod(text):
    specs = [
        cluster.worker_hosts_cluster(
            {"KERAS_SCALING_WORKER_HOSTS": text, "JOB_COMPLETION_INDEX": str(index)}
        )
        for index in (0, 1)
    ]
    for index, spec in enumerate(specs):
        assert spec.workers == ("t-0.svc:2222", "t-1.svc:2222")
        assert (spec.num_workers, spec.task_index) == (2, index)


def test_worker_hosts_ipv6_addresses_in_brackets():
    env = {
        "KERAS_SCALING_WORKER_HOSTS": "[fd00::1]:2222 [fd00::2]:2222",
        "JOB_COMPLETION_INDEX": "1",
    }
    spec = cluster.worker_hosts_cluster(env)
    assert spec.workers == ("[fd00::1]:2222", "[fd00::2]:2222")
    assert spec.address == "[fd00::2]:2222"


def test_worker_hosts_ipv6_address_without_brackets_names_them():
    env = {"KERAS_SCALING_WORKER_HOSTS": "fd00::1:2222,fd00::2:2222", "JOB_COMPLETION_INDEX": "0"}
    with pytest.raises(ValueError, match=r"\[fd00::1\]:2222"):
        cluster.worker_hosts_cluster(env)


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


def test_tf_config_evaluator_left_out_of_its_cluster_evaluates_alone():
    # Kubeflow's TFJob and AI Platform: the evaluator's cluster is the training's.
    config = {
        "cluster": {"chief": ["chief-0:2222"], "worker": ["worker-0:2222", "worker-1:2222"]},
        "task": {"type": "evaluator", "index": 0},
    }
    spec = cluster.resolve_cluster({"TF_CONFIG": json.dumps(config)})
    assert (spec.task_type, spec.task_index, spec.evaluator) == ("evaluator", 0, ())
    assert spec.address == ""
    assert spec.origin == (
        "TF_CONFIG: 1 chief, 2 workers; this is evaluator 0, outside the training cluster"
    )


def _ps_tf_config(task_type, index=0):
    cluster_ = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}
    return json.dumps({"cluster": cluster_, "task": {"type": task_type, "index": index}})


@pytest.mark.parametrize("task_type", ["chief", "worker", "ps"])
def test_tf_config_with_parameter_servers_is_refused_on_every_task(task_type):
    env = {"TF_CONFIG": _ps_tf_config(task_type)}
    with pytest.raises(ValueError, match="all-reduce.*tf.distribute.ParameterServerStrategy"):
        cluster.resolve_cluster(env)


def test_tf_config_evaluator_of_a_parameter_server_cluster_evaluates_alone():
    spec = cluster.resolve_cluster({"TF_CONFIG": _ps_tf_config("evaluator")})
    assert spec.task_type == "evaluator"


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
