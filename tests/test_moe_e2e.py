"""Qwen3-MoE end to end (issue 27): a tiny MoE made by transformers 5 (2 layers, 8 experts, top-2,
random bf16 weights, ``save_pretrained``), in both config-key forms, fine-tuned from its HF weights
on every backend that can run it (real torchrun, 2 CPU ranks, 1 step, lr 1e-12 so the export must
equal the source bit for bit):

* each export has exactly the source's key set (the Hub's per-expert layout) and its bf16 values;
* step-1 losses agree within 0.5 % across the backends on the same tokens (neither adds an aux
  loss: the config has output_router_logits false, so transformers trains without one too);
* ``verify-ckpt --round-trip`` passes each export (``from_pretrained`` of the folder), and
  ``trnqwen eval`` scores base and export (the same loss at lr 1e-12);
* native and hf-v5 (whose Transformers backend swaps torchtitan's MoE in) say which grouped GEMM
  ran on CPU and the load balancing in force (the ``[MoE]`` line).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_subprocess
from tests.moe_fixtures import write_tiny_moe

pytestmark = pytest.mark.slow

BACKENDS = ("native", "hf-v5", "hf-trainer")
DATA = Path(__file__).resolve().parents[1] / "trnqwen" / "data" / "tiny_chat" / "calculator.jsonl"


def _train(work: Path, assets: Path, backend: str):
    return run_subprocess(
        "train", "--finetune", "--assets", str(assets), "--backend", backend, "--dataset", str(DATA),
        "--steps", "1", "--lr", "1e-12", "--seq-len", "128", "--device", "cpu", "--nproc-per-node", "2",
        "--checkpoint-dir", str(work / f"ckpt-{backend}"), cwd=work, env={"HF_HUB_OFFLINE": "1"}, timeout=900,
    )


@pytest.fixture(scope="module", params=["local", "hub"])
def runs(request, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"moe-{request.param}")
    assets = write_tiny_moe(work / "tiny-moe", key_form=request.param)
    out = {}
    for backend in BACKENDS:
        res = _train(work, assets, backend)
        assert res.code == 0, res.text[-4000:]
        out[backend] = (res, work / f"ckpt-{backend}" / "hf" / "step-1", _last_log(work))
    return work, assets, out, request.param


def _last_log(work: Path) -> str:
    from trnqwen.rundir import last_run_dir

    return (last_run_dir(work / ".trnqwen" / "runs") / "train.log").read_text()


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _step1(log: str) -> float:
    from trnqwen.contract.stepline import parse_step_line

    losses = {m["step"]: m["loss"] for m in map(parse_step_line, log.splitlines()) if m}
    return losses[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_export_is_the_source_bit_for_bit_in_the_hub_layout(runs, backend):
    import torch

    _work, assets, out, _form = runs
    _res, export, _log = out[backend]
    got, want = _tensors(export), _tensors(assets)
    assert set(got) == set(want), sorted(set(got) ^ set(want))[:8]
    assert any(".mlp.experts.7.down_proj.weight" in k for k in got)
    differ = [k for k in want if got[k].dtype != want[k].dtype or not torch.equal(got[k], want[k])]
    assert differ == [], differ[:8]


def test_step1_losses_agree_across_backends(runs):
    _work, _assets, out, _form = runs
    losses = {b: _step1(log) for b, (_r, _e, log) in out.items()}
    ref = losses["hf-trainer"]
    assert all(abs(v - ref) / ref < 0.005 for v in losses.values()), losses


@pytest.mark.parametrize("backend", ["native", "hf-v5"])
def test_torchtitan_backends_log_the_grouped_gemm_and_load_balancing(runs, backend):
    _work, _assets, out, _form = runs
    log = out[backend][2]
    line = next(line for line in log.splitlines() if "[MoE] experts:" in line)
    assert "torch._grouped_mm on cpu" in line and "8 experts, top-2" in line
    assert "load balancing: none (as transformers trains this config" in line


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_ckpt_round_trips_each_export(runs, backend):
    work, _assets, out, _form = runs
    export = out[backend][1]
    res = run_subprocess("verify-ckpt", str(export), "--round-trip", "--json", cwd=work, timeout=300)
    assert res.code == 0, res.text[-3000:]
    doc = json.loads(res.out)
    rt = doc["round_trip"]
    assert doc["ok"] and rt["model_class"] == "Qwen3MoeForCausalLM" and rt["disagrees"] is None
    assert rt["loaded_problems"] == [] and rt["checked"] == "2 MoE layer(s) x 8 experts, top-2"


@pytest.mark.parametrize("backend", ["native"])  # the other backends' MoE LoRA plans: tests/test_moe.py, test_lora_hf_trainer.py
def test_lora_on_the_moe_adapts_attention_only_and_verifies(tmp_path, backend):
    """LoRA on a Qwen3-MoE: q/k/v/o adapters, routed experts frozen, a PEFT adapter that loads."""
    assets = write_tiny_moe(tmp_path / "tiny-moe")
    res = run_subprocess(
        "train", "--finetune", "--lora", "--assets", str(assets), "--backend", backend, "--dataset", str(DATA),
        "--steps", "1", "--seq-len", "128", "--device", "cpu", "--nproc-per-node", "2",
        "--checkpoint-dir", str(tmp_path / "ckpt"), cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"}, timeout=900,
    )
    assert res.code == 0, res.text[-4000:]
    assert "targets q_proj,k_proj,v_proj,o_proj" in res.text and "routed experts stay frozen" in res.text
    adapter = tmp_path / "ckpt" / "hf" / "step-1"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    check = run_subprocess("verify-ckpt", str(adapter), cwd=tmp_path, timeout=300)
    assert check.code == 0 and "a PEFT LoRA adapter that loads onto its base" in check.text, check.text[-3000:]


def test_eval_scores_base_and_each_export(runs):
    """``trnqwen eval`` loads every backend's MoE export and their base in one call; at lr 1e-12
    they all score the base's loss."""
    work, _assets, _out, _form = runs  # both key forms: eval reads each through from_pretrained
    run_ids = sorted(d.name for d in (work / ".trnqwen" / "runs").iterdir() if d.is_dir())
    assert len(run_ids) == len(BACKENDS)
    res = run_subprocess("eval", *run_ids, "--dataset", str(DATA), "--json", cwd=work, timeout=600)
    assert res.code == 0, res.text[-3000:]
    base, *tuned = json.loads(res.out)["results"]
    assert base["checkpoint"] == "base" and len(tuned) == len(BACKENDS)
    assert all(t["tokens"] == base["tokens"] > 0 and abs(t["loss"] - base["loss"]) < 1e-4 for t in tuned), (base, tuned)


@pytest.fixture(scope="module")
def mix_runs(tmp_path_factory):
    """A dense/MoE mix (3 layers, layer 1 dense by ``mlp_only_layers``) whose config asks for the
    router aux loss (``output_router_logits``)."""
    work = tmp_path_factory.mktemp("moe-mix")
    assets = write_tiny_moe(work / "tiny-moe", num_hidden_layers=3, mlp_only_layers=[1], output_router_logits=True)
    out = {}
    for backend in BACKENDS:
        res = _train(work, assets, backend)
        assert res.code == 0, res.text[-4000:]
        out[backend] = (work / f"ckpt-{backend}" / "hf" / "step-1", _last_log(work))
    return work, assets, out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dense_moe_mix_fine_tunes_and_round_trips(mix_runs, backend):
    import torch

    work, assets, out = mix_runs
    export, log = out[backend]
    got, want = _tensors(export), _tensors(assets)
    assert "model.layers.1.mlp.gate_proj.weight" in got and "model.layers.1.mlp.gate.weight" not in got
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    if backend != "hf-trainer":  # torchtitan has no router aux loss: its expert bias instead, and it says so
        assert "load balancing: torchtitan's aux-loss-free expert bias (coeff 0.001), not transformers' router aux loss" in log
    res = run_subprocess("verify-ckpt", str(export), "--round-trip", "--json", cwd=work, timeout=300)
    assert res.code == 0, res.text[-3000:]
    assert json.loads(res.out)["round_trip"]["checked"] == "2 MoE layer(s) x 8 experts, top-2"


# --- a MoE run that must learn (issue 34, item 27) ---------------------------------------------------
# Every run above trains at lr 1e-12 and checks bit-equal exports: frozen experts or a frozen router
# would pass them. Here 6 steps at a real rate, without weight decay (so a weight that moved had a
# gradient), must move every expert and every router and lower the loss.

LEARN_STEPS = 6


@pytest.fixture(scope="module")
def learning_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("moe-learn")
    assets = write_tiny_moe(work / "tiny-moe")
    out = {}
    for backend in BACKENDS:
        res = run_subprocess(
            "train", "--finetune", "--assets", str(assets), "--backend", backend, "--dataset", str(DATA),
            "--steps", str(LEARN_STEPS), "--lr", "2e-3", "--weight-decay", "0", "--warmup", "0", "--lr-schedule", "constant",
            "--seq-len", "128", "--device", "cpu", "--nproc-per-node", "2", "--checkpoint-dir", str(work / f"ckpt-{backend}"),
            cwd=work, env={"HF_HUB_OFFLINE": "1"}, timeout=900,
        )
        assert res.code == 0, res.text[-4000:]
        out[backend] = (work / f"ckpt-{backend}" / "hf" / f"step-{LEARN_STEPS}", _last_log(work))
    return {"assets": assets, "out": out}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_rate_moves_every_expert_and_router_and_lowers_the_loss(learning_runs, backend):
    import re

    import torch

    assets, out = learning_runs["assets"], learning_runs["out"]
    export, log = out[backend]
    got, want = _tensors(export), _tensors(assets)
    assert set(got) == set(want)
    routers = [k for k in want if re.fullmatch(r"model\.layers\.\d+\.mlp\.gate\.weight", k)]
    experts = [k for k in want if ".mlp.experts." in k]
    assert len(routers) == 2 and len(experts) == 2 * 8 * 3, (routers, len(experts))
    still = sorted(k for k in routers + experts if torch.equal(got[k], want[k]))
    assert not set(still) & set(routers), (backend, still)  # every router learned
    unmoved_experts = {k.rsplit(".", 2)[0] for k in still}
    for layer in (0, 1):  # frozen experts would leave all 8 of a layer; a random router starves one or two
        assert sum(e.startswith(f"model.layers.{layer}.") for e in unmoved_experts) <= 2, (backend, still)
    # an expert moves only with its tokens: each that did not move kept all three weights, and the
    # same ones stayed on every backend (same weights, same tokens, same routing); measured: layer 1's
    # expert 5 gets no token in these 6 steps on all three
    assert all(f"{e}.{w}.weight" in still for e in unmoved_experts for w in ("gate_proj", "up_proj", "down_proj")), still
    learning_runs.setdefault("unmoved", {})[backend] = unmoved_experts
    assert len({frozenset(v) for v in learning_runs["unmoved"].values()}) == 1, learning_runs["unmoved"]
    from trnqwen.contract.stepline import parse_step_line

    losses = {m["step"]: m["loss"] for m in map(parse_step_line, log.splitlines()) if m}
    assert sorted(losses) == list(range(1, LEARN_STEPS + 1)), losses
    print(backend, "MoE losses", [round(losses[s], 4) for s in sorted(losses)])
    assert losses[LEARN_STEPS] < losses[1] - 0.05, (backend, losses)
