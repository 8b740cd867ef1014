"""Multi-node: rendezvous argv, topology over N x ranks, EFA env, per-node paths (units);
a REAL two-"node" CPU run over a loopback rendezvous (slow)."""

from __future__ import annotations

import pytest

from trnqwen.config import RunConfig
from trnqwen.errors import UsageError
from trnqwen.env.device import DeviceInfo
from trnqwen.train import multinode as mn
from trnqwen.contract.topology import topology
from trnqwen.train.topology import plan_topology


# --- rendezvous argv (the launcher's only source of these flags) --------------------------------


def _flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(0, len(argv), 2)}


def _node(**fields) -> RunConfig:
    return RunConfig.model_construct(**{**RunConfig().model_dump(), **fields})


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_rendezvous_argv_for_one_node_of_four(rank):
    cfg = _node(nnodes=4, node_rank=rank, rdzv_endpoint="10.0.0.5:29500", rdzv_id="job-7", max_restarts=2)
    argv = mn.rendezvous_argv(cfg, 64)
    assert argv[:4] == ["--nnodes", "4", "--node-rank", str(rank)]
    assert _flags(argv) == {
        "--nnodes": "4",
        "--node-rank": str(rank),
        "--nproc_per_node": "64",
        "--rdzv_backend": "c10d",
        "--rdzv_endpoint": "10.0.0.5:29500",
        "--rdzv_id": "job-7",
        "--rdzv_conf": f"is_host={1 if rank == 0 else 0}",
        "--max-restarts": "2",
    }


def test_rendezvous_argv_keeps_an_ipv6_endpoint():
    argv = mn.rendezvous_argv(_node(nnodes=2, node_rank=1, rdzv_endpoint="[fd00::1]:1234", rdzv_id="x"), 2)
    assert _flags(argv)["--rdzv_endpoint"] == "[fd00::1]:1234"


def test_single_node_rendezvous_is_local():
    assert mn.rendezvous_argv(RunConfig(), 2) == [
        "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", mn.LOCAL_RDZV_ENDPOINT,
    ]  # fmt: skip
    flags = _flags(mn.rendezvous_argv(RunConfig(max_restarts=3), 1))
    assert flags["--max-restarts"] == "3" and "--nnodes" not in flags and "--rdzv_conf" not in flags


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(nnodes=2, node_rank=2, rdzv_endpoint="h:1", rdzv_id="x"), "outside 0..1"),
        (dict(nnodes=2, node_rank=0, rdzv_endpoint=None, rdzv_id="x"), "rendezvous endpoint"),
        (dict(nnodes=2, node_rank=0, rdzv_endpoint="h:1", rdzv_id=None), "rendezvous id"),
        (dict(nnodes=2, node_rank=0, rdzv_endpoint="h:1", rdzv_id="a b"), "letters, digits"),
        (dict(nnodes=2, node_rank=0, rdzv_endpoint="h:99999", rdzv_id="x"), "out of range"),
        (dict(nnodes=2, node_rank=0, rdzv_endpoint="h:0", rdzv_id="x"), "out of range"),
        (dict(nnodes=2, node_rank=0, rdzv_endpoint="a b:1", rdzv_id="x"), "HOST:PORT"),
    ],
)
def test_topology_mistakes_are_usage_errors_with_hints(fields, words):
    with pytest.raises(UsageError) as exc:
        mn.rendezvous_argv(_node(**fields), 2)
    assert words in exc.value.message
    assert exc.value.hint


def test_endpoint_without_port_gets_torchruns_default():
    assert mn.parse_endpoint("head") == ("head", mn.DEFAULT_RDZV_PORT)
    assert mn.parse_endpoint("[fd00::1]:1234") == ("fd00::1", 1234)


# --- topology over N x ranks (trnqwen.train.topology) --------------------------------------------


def test_topology_over_two_trn2_nodes_matches_torchtitan_rules():
    topo = topology(nnodes=2, nproc_per_node=64, tp=4, local_batch_size=1, global_batch_size=64)
    assert topo.world_size == 128 and topo.dp == 32 and topo.tp == 4
    assert topo.sequences_per_step == 64 and topo.grad_accum_steps == 2
    assert topo.ok and topo.warnings == ()


def test_topology_default_global_batch_is_local_times_dp():
    topo = topology(nnodes=3, nproc_per_node=4, local_batch_size=2)
    assert (topo.world_size, topo.dp, topo.sequences_per_step, topo.grad_accum_steps) == (12, 12, 24, 1)


def test_topology_warns_when_tp_groups_cross_nodes():
    topo = topology(nnodes=2, nproc_per_node=6, tp=4)
    assert topo.dp == 3 and topo.ok
    assert any("span" in w for w in topo.warnings)


@pytest.mark.parametrize(
    "kwargs, check, words, hint",
    [
        (dict(nnodes=2, nproc_per_node=64, tp=3), "parallelism", "--tp 3 does not divide the 128 ranks", "divisors of 128"),
        (dict(nnodes=2, nproc_per_node=64, dp_shard=64, tp=1), "parallelism", "= 64 ranks, but the run has 128", "--dp-shard -1"),
        (dict(nnodes=2, nproc_per_node=64, local_batch_size=1, global_batch_size=100), "batch",
         "global batch 100 is not a multiple of local batch 1 x data-parallel degree 128", "--global-batch-size 128"),
    ],
)
def test_topology_names_what_torchtitan_would_reject(kwargs, check, words, hint):
    topo = topology(**kwargs)
    assert not topo.ok and [p.check for p in topo.problems] == [check]
    assert words in topo.problems[0].message and hint in topo.problems[0].hint


def test_plan_topology_counts_every_node_of_the_config():
    cfg = RunConfig(nnodes=4, tp=2, local_batch_size=1, global_batch_size=256, nproc_per_node=64)
    topo = plan_topology(cfg, DeviceInfo(type="cpu", count=1))
    assert topo.world_size == 256 and topo.dp == 128 and topo.grad_accum_steps == 2
    # Without --nproc-per-node: every device of the node (1 on CPU).
    assert plan_topology(RunConfig(), DeviceInfo(type="neuron", count=64)).nproc_per_node == 64
    assert plan_topology(RunConfig(), DeviceInfo(type="cpu", count=8)).nproc_per_node == 1


# --- environment -------------------------------------------------------------------------------


def test_efa_env_only_for_multinode_neuron_and_user_values_win():
    assert mn.multinode_env("neuron", 1, environ={}) == {}
    assert mn.multinode_env("cpu", 4, environ={}) == {}
    env = mn.multinode_env("neuron", 2, environ={"FI_EFA_FORK_SAFE": "0"})
    assert env == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}
    eks = mn.multinode_env("neuron", 2, kubernetes=True, environ={})
    assert eks["CCOM_SOCKET_IFNAME"] == "eth0" and eks["FI_PROVIDER"] == "efa"
    assert not any(k.startswith("NCCL_") for k in eks)  # Neuron collectives do not use NCCL


def test_config_env_round_trips_through_resolve_config():
    """The TRNQWEN_* variables a scheduler exports resolve, on the node, to the same config."""
    from trnqwen.config import resolve_config

    cfg = RunConfig(
        model="builtin:tiny-qwen3", device="cpu", steps=3, seq_len=128, finetune=True, lr=1e-4,
        override_imports=["a.b", "c.d"], nnodes=2, partition="p", image="img",
    )  # fmt: skip
    env = mn.node_env(cfg, rdzv_id="run-1")
    assert env["TRNQWEN_LAUNCHER"] == "local" and env["TRNQWEN_NNODES"] == "2" and env["TRNQWEN_RDZV_ID"] == "run-1"
    assert "TRNQWEN_PARTITION" not in env and "TRNQWEN_IMAGE" not in env and "TRNQWEN_NODE_RANK" not in env
    node = resolve_config({}, environ={**env, "TRNQWEN_NODE_RANK": "1", "TRNQWEN_RDZV_ENDPOINT": "h:1"}).config
    mine = cfg.model_dump()
    theirs = node.model_dump()
    for name in mine:
        if name in ("launcher", "node_rank", "rdzv_endpoint", "rdzv_id", "partition", "image"):
            continue
        assert theirs[name] == mine[name], name
    assert (node.launcher, node.node_rank, node.rdzv_id) == ("local", 1, "run-1")


def test_node_wrapper_reads_rank_at_run_time():
    import subprocess

    body = mn.node_wrapper("MY_NODE", "$HEAD:29400")
    out = subprocess.run(
        ["bash", "-c", body, "n", "bash", "-c", 'echo "$TRNQWEN_NODE_RANK $TRNQWEN_RDZV_ENDPOINT $1"', "x", "it's $quoted"],
        capture_output=True, text=True, env={"MY_NODE": "3", "HEAD": "10.1.2.3", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.stdout.strip() == "3 10.1.2.3:29400 it's $quoted"


# --- per-node paths ----------------------------------------------------------------------------


def test_node_paths_and_shared_run_dir(tmp_path):
    path = tmp_path / "runs" / "ft-1"
    for rank in (0, 1):  # what each node makes of the shared run dir
        mn.node_dir(path, rank).mkdir(parents=True, exist_ok=True)
    assert mn.node_log_path(path, 1) == path / "nodes" / "node1" / "train.log"
    mn.node_log_path(path, 0).write_text("x")
    mn.node_log_path(path, 1).write_text("y")
    assert mn.node_logs(path) == {0: mn.node_log_path(path, 0), 1: mn.node_log_path(path, 1)}
    assert mn.writes_run_record(0) and not mn.writes_run_record(1)


@pytest.mark.parametrize("nnodes", [1, 2])
def test_a_rendezvous_id_never_names_a_folder_outside_the_runs_dir(tmp_path, monkeypatch, nnodes):
    """--rdzv-id names the run directory, on one node too (a scheduler's one-node job): ../escape is refused."""
    from trnqwen.config import resolve_config
    from trnqwen.train.run import plan_train

    monkeypatch.chdir(tmp_path)
    resolved = resolve_config({"rdzv_id": "../escape", "nnodes": nnodes, "rdzv_endpoint": "head:29400", "device": "cpu"},
                              environ={})
    with pytest.raises(UsageError, match="--rdzv-id '../escape'"):
        plan_train(resolved, dry_run=True, cwd=tmp_path)
    assert not (tmp_path / ".trnqwen").exists() and not (tmp_path / "escape").exists()


def test_explain_failure_names_the_peer_loss_only_for_multinode(tmp_path):
    err = "RuntimeError: [gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:16047: Connection reset by peer."
    msg, hint = mn.explain_failure(err, nnodes=2, node_rank=0, run_dir=tmp_path)
    assert "another node of the 2-node job stopped" in msg and "Connection reset by peer" in msg
    assert "--rdzv-id" in hint
    assert mn.explain_failure(err, nnodes=1, node_rank=0) is None
    assert mn.explain_failure("ValueError: bad shape", nnodes=2, node_rank=0) is None


# --- REAL: two "nodes" on this machine meeting at a loopback rendezvous -------------------------

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.helpers import REPO_ROOT, assert_verified_export, run_subprocess  # noqa: E402

TINY_RUN = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "1", "--seq-len", "128", "--finetune"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(work: Path, rank: int, port: int, rdzv_id: str, steps: int) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [
        sys.executable, "-m", "trnqwen", "train", *TINY_RUN, "--steps", str(steps),
        "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id,
    ]  # fmt: skip
    out = open(work / f"node{rank}.out", "w")
    return subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_tree(proc: subprocess.Popen) -> None:
    """A node dying: trnqwen, its torchrun agent and the rank, all at once (SIGKILL)."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        everyone = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in everyone:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _work(tmp_path: Path) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    work = tmp_path / "work"
    write_tiny_qwen3(work / "assets" / "hf" / "tiny-qwen3")
    return work


@pytest.mark.slow
def test_two_nodes_on_loopback_train_one_consolidated_checkpoint(tmp_path):
    work = _work(tmp_path)
    port = _free_port()
    started = time.monotonic()
    nodes = [_start_node(work, r, port, "mn-e2e", steps=2) for r in (0, 1)]
    try:
        codes = [p.wait(timeout=420) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                _kill_tree(p)
    wall = time.monotonic() - started
    outs = {r: (work / f"node{r}.out").read_text(errors="replace") for r in (0, 1)}
    assert codes == [0, 0], outs
    print(f"\n2-node loopback run (tiny Qwen3, 1 CPU rank per node, 2 steps, seq 128): {wall:.1f} s wall")
    run_dir = work / ".trnqwen" / "runs" / "mn-e2e"
    logs = mn.node_logs(run_dir)
    assert sorted(logs) == [0, 1]
    for log in logs.values():
        assert "step:" in log.read_text()
    # One run dir shared by name; node 0 owns run.json and LAST, node 1 keeps its own record.
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["extra"]["nnodes"] == 2 and record["extra"]["node_rank"] == 0
    assert record["extra"]["world_size"] == 2
    assert json.loads((mn.node_dir(run_dir, 1) / "run.json").read_text())["status"] == "succeeded"
    assert (work / ".trnqwen" / "runs" / "LAST").read_text().strip() == "mn-e2e"
    # torchrun really ran as node r of 2 with node 0 hosting the store.
    for r in (0, 1):
        cmd = (mn.node_dir(run_dir, r) / "command.sh").read_text()
        assert "--nnodes 2" in cmd and f"--node-rank {r}" in cmd and f"is_host={1 if r == 0 else 0}" in cmd
    # ONE consolidated HF checkpoint that verify-ckpt accepts (default: the last run's export).
    exports = list((work / "checkpoint_tiny_qwen3_f7b2a8_ft" / "hf").glob("step-*/model-*.safetensors"))
    assert [p.name for p in exports] == ["model-00001-of-00001.safetensors"]
    r = run_subprocess("verify-ckpt", "--json", cwd=work, timeout=300)
    assert r.code == 0, r.text
    assert_verified_export(json.loads(r.out), exports[0].parent, step=2)


@pytest.mark.slow
def test_a_node_that_dies_mid_run_stops_the_other_with_a_clear_message(tmp_path):
    work = _work(tmp_path)
    port = _free_port()
    nodes = [_start_node(work, r, port, "mn-dead", steps=500) for r in (0, 1)]
    log0 = work / ".trnqwen" / "runs" / "mn-dead" / "nodes" / "node0" / "train.log"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if log0.is_file() and "step:  2" in log0.read_text(errors="replace"):
                break
            assert nodes[0].poll() is None and nodes[1].poll() is None, (work / "node0.out").read_text()
            time.sleep(0.5)
        else:
            pytest.fail("the 2-node run never reached step 2:\n" + (work / "node0.out").read_text()[-3000:])
        _kill_tree(nodes[1])
        killed_at = time.monotonic()
        # Bounded: well inside torchrun's rendezvous join timeout (600 s); no hang.
        code = nodes[0].wait(timeout=180)
        stopped_after = time.monotonic() - killed_at
    finally:
        for p in nodes:
            if p.poll() is None:
                _kill_tree(p)
    out = (work / "node0.out").read_text(errors="replace")
    print(f"\nsurvivor stopped {stopped_after:.1f} s after its peer was killed")
    assert code == 1, out[-3000:]
    assert "another node of the 2-node job stopped or became unreachable" in out, out[-3000:]
    assert "Traceback" not in out
    record = json.loads((work / ".trnqwen" / "runs" / "mn-dead" / "run.json").read_text())
    assert record["status"] == "failed" and "another node" in record["error"]


def test_multinode_plan_on_a_trainium_host_carries_efa_env_and_node_paths(tmp_path):
    """plan_train (no side effects) for node 1 of 2 on a (nominal) trn2: EFA vars, shared run dir, node log."""
    from trnqwen.fetch.builtin import write_tiny_qwen3
    from trnqwen.train.run import NOMINAL_DEVICES, plan_train

    assets = write_tiny_qwen3(tmp_path / "assets" / "hf" / "tiny-qwen3")
    cfg = RunConfig(
        model="builtin:tiny-qwen3", assets_dir=assets, device="neuron", nnodes=2, node_rank=1,
        rdzv_endpoint="10.0.0.5:29400", rdzv_id="ft-2", seq_len=256, runs_dir=tmp_path / "runs",
    )  # fmt: skip
    plan = plan_train(cfg, device=NOMINAL_DEVICES["neuron"], dry_run=True, cwd=tmp_path)
    assert plan.run_dir == tmp_path / "runs" / "ft-2"
    assert plan.log_path == plan.run_dir / "nodes" / "node1" / "train.log"
    assert {k: plan.env[k] for k in mn.NEURON_EFA_ENV} == mn.NEURON_EFA_ENV
    argv = plan.argv
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--rdzv_conf") + 1] == "is_host=0"
    assert plan.as_dict()["world_size"] == 128
