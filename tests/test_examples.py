"""examples/: the trnqwen.toml files load, the pure-PyTorch RoPE override equals torchtitan's
rotary embedding bit for bit (with per-document positions too, forward and backward), a real CPU
run logs its override once per layer, runs the custom path on every call and trains to the same
losses as torchtitan's own RoPE, and the NKI example works against test doubles of torch-neuronx
and nkilib."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, run_subprocess

EXAMPLES = REPO_ROOT / "examples"
TORCH_ROPE_DIR = EXAMPLES / "torch_rope"
NKI_ROPE_DIR = EXAMPLES / "nki_rope"
NKI_DOUBLES = REPO_ROOT / "tests" / "doubles" / "nki"


def _import_from(folder: Path, name: str, *extra_paths: Path):
    """Import an example module once per session (its @override and custom ops register once)."""
    if name in sys.modules:
        return sys.modules[name]
    added = [str(p) for p in (*extra_paths, folder)]
    for p in reversed(added):
        sys.path.insert(0, p)
    try:
        return importlib.import_module(name)
    finally:
        for p in added:
            sys.path.remove(p)


@pytest.fixture(scope="session")
def torch_rope():
    return _import_from(TORCH_ROPE_DIR, "torch_rope_override")


@pytest.fixture(scope="session")
def nki_example():
    """The NKI example imported against the doubles; the doubles leave sys.modules afterwards
    (the real torch_neuronx test double of check-env lives elsewhere)."""
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] in ("torch_neuronx", "nkilib")}
    try:
        module = _import_from(NKI_ROPE_DIR, "my_neuron_kernels", NKI_DOUBLES)
        yield module
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in ("torch_neuronx", "nkilib")]:
            sys.modules.pop(k)
        sys.modules.update(saved)


def _qk(batch=2, seq=256, heads=4, kv_heads=2, head_dim=32, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=g, dtype=torch.float32)
    k = torch.randn(batch, seq, kv_heads, head_dim, generator=g, dtype=torch.float32)
    return q, k


def _titan_rope(head_dim=32, max_seq_len=512, theta=1e6):
    from torchtitan.models.common.rope import CosSinRoPE

    return CosSinRoPE.Config(dim=head_dim, max_seq_len=max_seq_len, theta=theta)


def _packed_positions(batch=2, seq=256):
    """Per-document positions as torchtitan 0.3.0's text dataloader yields them: each row packs
    several documents, positions restart at 0 at each document, and the rows differ."""
    import torch

    rows = [[100, 156], [30, 200, 26], [7, 1, 120, 128]]
    return torch.stack([torch.cat([torch.arange(n) for n in rows[i % len(rows)]]) for i in range(batch)])


def _rope_results(module, q, k, positions=None):
    """(q_out, k_out, dq, dk) through ``module`` for a loss that weighs every output differently."""
    import torch

    qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
    out_q, out_k = module(qq, kk, positions)
    (out_q.square().sum() + (out_k * torch.arange(float(k.shape[-1]))).sum()).backward()
    return out_q.detach(), out_k.detach(), qq.grad, kk.grad


def _calls(module):
    return int(module.custom_calls), int(module.fallback_calls)


# --- trnqwen.toml examples ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["hf-v5", "native", "nki-moe", "dpo"])
def test_each_trn2_example_config_resolves(backend, in_tmp):
    from trnqwen.config import resolve_config

    path = EXAMPLES / f"trn2-{backend}.toml"
    resolved = resolve_config({}, config_file=path, environ={})
    cfg = resolved.config
    if backend == "dpo":  # preference tuning with a LoRA adapter on the recipe's backend
        assert (cfg.method, cfg.beta, cfg.dpo_loss, cfg.lora, cfg.lr) == ("dpo", 0.1, "sigmoid", True, 5e-6)
        backend = "hf-v5"
    assert cfg.backend == backend
    assert cfg.device == "neuron" and cfg.nproc_per_node == 64 and cfg.lnc == 2
    assert cfg.finetune is True
    assert cfg.seq_len % (128 * cfg.lnc) == 0  # no recompiles, NKI-friendly
    assert all(src.startswith("file ") for src in resolved.sources.values())
    if backend == "nki-moe":
        assert (cfg.model, cfg.moe_layers, cfg.num_experts, cfg.top_k) == ("Qwen/Qwen3-30B-A3B", 4, 64, 4)
    else:
        assert cfg.model == "Qwen/Qwen3-4B-Instruct-2507"


def test_example_configs_plan_a_64_rank_run_on_a_nominal_trn2(in_tmp):
    """Through the real planner (--dry-run path): 64 ranks, the recipe's torchrun line."""
    from trnqwen.config import resolve_config
    from trnqwen.train.run import plan_train

    cfg = resolve_config({"assets_dir": str(in_tmp / "missing")}, config_file=EXAMPLES / "trn2-native.toml",
                         environ={}).config
    plan = plan_train(cfg, dry_run=True)
    assert plan.device.type == "neuron" and plan.topology.world_size == plan.nproc_per_node == 64
    argv = plan.argv
    assert argv[argv.index("--nproc_per_node") + 1] == "64"
    assert argv[argv.index("--rdzv_endpoint") + 1] == "localhost:0"
    assert argv[argv.index("-m", 3) + 1] == plan.job.entry_module and plan.job.backend == cfg.backend == "native"


# --- (1) the pure-PyTorch RoPE equals torchtitan's exactly ------------------------------------------


def test_torch_rope_matches_torchtitan_rotary_embedding_exactly(torch_rope):
    import torch

    titan = _titan_rope().build()
    ours = torch_rope.TorchRoPE.Config(**{f: getattr(_titan_rope(), f) for f in ("dim", "max_seq_len", "theta")}).build()
    assert isinstance(ours, torch_rope.TorchRoPE)
    q, k = _qk()
    ref_q, ref_k = titan(q, k)
    got_q, got_k = ours(q, k)
    assert got_q.shape == q.shape and got_k.shape == k.shape and got_q.dtype == torch.float32
    assert (got_q - ref_q).abs().max().item() == 0.0
    assert (got_k - ref_k).abs().max().item() == 0.0
    # and it really rotates: the output is not the input
    assert (got_q - q).abs().max().item() > 0.1


def test_torch_rope_gradients_match_torchtitan(torch_rope):
    import torch

    titan = _titan_rope().build()
    ours = torch_rope.TorchRoPE.Config(dim=32, max_seq_len=512, theta=1e6).build()
    q, k = _qk(seq=128)
    grads = []
    for module in (titan, ours):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        out_q, out_k = module(qq, kk)
        (out_q.square().sum() + (out_k * 3).sum()).backward()
        grads.append((qq.grad, kk.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("rows", ["per-row", "shared"])
def test_torch_rope_with_per_document_positions_equals_torchtitan_forward_and_backward(torch_rope, rows):
    """Packed documents whose positions reset mid-sequence: the twin takes its own path (a
    gathered [batch, seq, head_dim*2] cache) and matches CosSinRoPE exactly, max abs diff 0."""
    titan = _titan_rope().build()
    ours = torch_rope.TorchRoPE.Config(dim=32, max_seq_len=512, theta=1e6).build()
    q, k = _qk(batch=3, seq=256)
    positions = _packed_positions(batch=3) if rows == "per-row" else _packed_positions(batch=1)
    assert (positions[:, 1:] == 0).any()  # a document starts mid-window
    ref = _rope_results(titan, q, k, positions)
    got = _rope_results(ours, q, k, positions)
    for r, g in zip(ref, got):
        assert g.shape == r.shape and (g - r).abs().max().item() == 0.0
    assert _calls(ours) == (1, 0)
    # the positions matter: the prefix cache would give a different answer
    assert (_rope_results(titan, q, k)[0] - got[0]).abs().max().item() > 0.1


def test_gathered_cache_has_one_row_per_token(torch_rope):
    import torch

    cache = _titan_rope().build().cache
    positions = _packed_positions(batch=2)
    gathered, why = torch_rope.gather_rope_cache(cache, positions, 2, 256)
    assert why == "" and gathered.shape == (2, 256, 64) and gathered.is_contiguous()
    assert torch.equal(gathered[1, 30], cache[0]) and torch.equal(gathered[1, 229], cache[199])
    single, _ = torch_rope.gather_rope_cache(cache, positions[:1], 2, 256)
    assert single.shape == (256, 64) and torch.equal(single[100], cache[0])
    prefix, _ = torch_rope.gather_rope_cache(cache, None, 2, 256)
    assert torch.equal(prefix, cache[:256])
    none, why = torch_rope.gather_rope_cache(cache, positions[:, :128], 2, 256)
    assert none is None and "do not match" in why


def test_torch_rope_counts_fallbacks_and_logs_one_calls_line_after_the_first_step(torch_rope, caplog):
    """A call it cannot serve falls back (counted, warned); the first optimizer step logs the
    documented line once; later steps log nothing more."""
    import logging

    import torch

    titan = _titan_rope().build()
    ours = torch_rope.TorchRoPE.Config(dim=32, max_seq_len=512, theta=1e6, override_name="test.torch_rope").build()
    assert ours.counter is torch_rope.counter_for("test.torch_rope")
    q, k = _qk(batch=2, seq=256)
    ours(q, k, _packed_positions(batch=2))
    bad = _packed_positions(batch=2)[:, :128]  # positions that do not fit q: torchtitan's path
    with pytest.raises(RuntimeError):  # ...which rejects them too: the fallback really ran it
        ours(q, k, bad)
    assert _calls(ours) == (1, 1)
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    with caplog.at_level(logging.INFO, logger=""):
        for _ in range(2):
            param.sum().backward()
            opt.step()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[OverrideCalls] test.torch_rope")]
    assert lines == ["[OverrideCalls] test.torch_rope: calls=1 fallbacks=1 modules=1 rank=0 step=1 reason: "
                     "positions of shape (2, 128) do not match q's local [batch=2, seq=256]"]
    del titan


def test_example_counter_waits_for_a_step_that_followed_a_call_as_on_resume(torch_rope, caplog):
    """A resumed run's checkpoint load takes one optimizer step before any forward: the examples'
    counter (trnqwen's ModuleCallCounter, shared) logs after the first step that followed a call,
    with that call counted, not calls=0 after the load's step."""
    import logging

    import torch

    ours = torch_rope.TorchRoPE.Config(dim=32, max_seq_len=512, theta=1e6, override_name="test.resumed_rope").build()
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    q, k = _qk(batch=2, seq=256)
    with caplog.at_level(logging.INFO, logger=""):
        opt.step()  # the checkpoint load's step: no gradients, no forward yet
        ours(q, k, _packed_positions(batch=2))
        param.sum().backward()
        opt.step()  # the first training step
        opt.step()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[OverrideCalls] test.resumed_rope")]
    assert lines == ["[OverrideCalls] test.resumed_rope: calls=1 fallbacks=0 modules=1 rank=0 step=1"]
    from trnqwen.runtime.override_calls import ModuleCallCounter

    assert isinstance(ours.counter, ModuleCallCounter)  # one helper, trnqwen's, not a copy in the example


def test_torch_rope_override_replaces_every_layer_of_a_qwen3_config(torch_rope):
    """torchtitan's own apply_overrides on a Qwen3 model config: one replacement per layer."""
    from torchtitan.config.override import OverrideConfig, apply_overrides

    from trnqwen.runtime.qwen3_native import qwen3_model_spec

    spec = qwen3_model_spec(name="t", dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128,
                            vocab_size=256, tied=True, rope_theta=1e6, max_seq_len=256)

    lines = apply_overrides(OverrideConfig(imports=["torch_rope_override.torch_rope"]), _Holder(spec))
    assert len(lines) == 3
    assert [line.split(": ", 1)[1].split()[0] for line in lines] == [
        f"model_spec.model.layers.{i}.attention.rope" for i in range(3)
    ]
    assert all("CosSinRoPE.Config -> TorchRoPE.Config" in line for line in lines)
    assert all(type(layer.attention.rope) is torch_rope.TorchRoPE.Config for layer in spec.model.layers)


class _Holder:
    """A root config holding ``model_spec`` (what Trainer.Config looks like to traverse)."""

    def __init__(self, spec):
        self.model_spec = spec

    def traverse(self, config_cls, *, recurse=False, _prefix=""):
        yield from self.model_spec.traverse(config_cls, recurse=recurse, _prefix="model_spec")


# --- (2) a real CPU run: inspect-logs counts the override once per layer -----------------------------


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    work = tmp_path_factory.mktemp("override_assets")
    assets = work / "assets"
    fetched = run_subprocess("fetch", "builtin:tiny-qwen3", "--local-dir", str(assets), cwd=work)
    assert fetched.code == 0, fetched.text
    return assets


def _train_tiny(work: Path, assets: Path, *extra: str) -> dict:
    """``trnqwen train`` for real: native backend, the built-in tiny Qwen3 (seeded random init,
    the same data every time), 1 CPU rank, 2 steps."""
    import os

    env = {
        "PYTHONPATH": os.pathsep.join([str(TORCH_ROPE_DIR), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
    }
    result = run_subprocess(
        "train", "--backend", "native", "--model", "builtin:tiny-qwen3", "--assets", str(assets),
        "--device", "cpu", "--nproc-per-node", "1", "--steps", "2", "--seq-len", "256", "--json", *extra,
        env=env, cwd=work, timeout=600,
    )
    assert result.code == 0, result.text[-4000:]
    return json.loads(result.out)


@pytest.fixture(scope="session")
def override_run(tmp_path_factory, tiny_assets):
    """``trnqwen train --override-imports torch_rope_override.torch_rope``."""
    work = tmp_path_factory.mktemp("override_run")
    return _train_tiny(work, tiny_assets, "--override-imports", "torch_rope_override.torch_rope"), work


@pytest.fixture(scope="session")
def baseline_run(tmp_path_factory, tiny_assets):
    """The same run with torchtitan's own RoPE."""
    work = tmp_path_factory.mktemp("baseline_run")
    return _train_tiny(work, tiny_assets), work


def _calls_lines(log_path) -> list[dict]:
    from trnqwen.contract.stepline import strip_ansi
    from trnqwen.contract.override_calls import parse_calls_line

    lines = Path(log_path).read_text(errors="replace").splitlines()
    return [rec for rec in (parse_calls_line(strip_ansi(line)) for line in lines) if rec]


@pytest.mark.slow
def test_real_run_logs_the_override_exactly_once_per_layer(override_run):
    from trnqwen.logs.core import inspect_input
    from trnqwen.logs.judge import override_table
    from trnqwen.logs.sources import resolve_input
    from trnqwen.fetch.builtin import tiny_qwen3_config

    outcome, _work = override_run
    n_layers = tiny_qwen3_config()["num_hidden_layers"]
    inspection = inspect_input(resolve_input(outcome["run_dir"]))
    table = override_table(inspection.log, inspection.ctx.num_layers)
    entry = table["torch_rope_override.torch_rope"]
    assert entry["count"] == n_layers
    assert entry["layers"] == list(range(n_layers))
    assert entry["missing_layers"] == [] and entry["duplicate_layers"] == []
    assert (entry["old"], entry["new"]) == ("CosSinRoPE.Config", "TorchRoPE.Config")
    ok = [f for f in inspection.findings if f.code == "override-ok" and "torch_rope_override.torch_rope" in f.message]
    assert ok, [f.as_dict() for f in inspection.findings]
    assert not [f for f in inspection.findings if f.code.startswith("override-") and f.severity == "error"]
    steps = list(inspection.log.steps.rows())
    assert [s["step"] for s in steps] == [1, 2]


@pytest.mark.slow
def test_real_run_takes_the_custom_path_on_every_call_and_every_layer(override_run):
    """The proof the [Override] lines cannot give: the twin's own rotation ran (calls > 0) on
    every layer, and never fell back, on the per-document positions torchtitan's loader yields."""
    from trnqwen.fetch.builtin import tiny_qwen3_config

    outcome, work = override_run
    n_layers = tiny_qwen3_config()["num_hidden_layers"]
    recs = {rec["name"]: rec for rec in _calls_lines(outcome["log"])}
    twin = recs["torch_rope_override.torch_rope"]
    assert twin["calls"] > 0 and twin["calls"] % n_layers == 0, twin
    assert twin["fallbacks"] == 0 and twin["modules"] == n_layers and twin["rank"] == 0, twin
    # inspect-logs --json reads it: overrides[<name>].calls / .fallbacks, and judges it healthy
    shown = run_subprocess("inspect-logs", outcome["run_dir"], "--json", cwd=work)
    assert shown.code == 0, shown.text
    report = json.loads(shown.out)
    entry = report["overrides"]["torch_rope_override.torch_rope"]
    assert (entry["count"], entry["calls"], entry["fallbacks"], entry["modules"]) == (n_layers, twin["calls"], 0, n_layers)
    codes = {(f["code"], f["severity"]) for f in report["findings"] if "torch_rope_override" in f["message"]}
    assert ("override-ran", "info") in codes and not [c for c in codes if c[1] != "info"], codes
    # trnqwen's own CPU attention override reports the same way
    attention = report["overrides"]["trnqwen.runtime.cpu_attention.cpu_dense_attention"]
    assert (attention["calls"], attention["fallbacks"], attention["modules"]) == (twin["calls"], 0, n_layers)


@pytest.mark.slow
def test_real_run_with_the_twin_trains_to_torchtitans_losses(override_run, baseline_run):
    """Same weights (seeded init), same data: the step losses with the twin override equal the
    losses with torchtitan's CosSinRoPE (to the printed 5 decimals, so within 1e-5)."""
    from trnqwen.logs.core import inspect_input
    from trnqwen.logs.sources import resolve_input

    losses = []
    for outcome, _work in (override_run, baseline_run):
        inspection = inspect_input(resolve_input(outcome["run_dir"]))
        losses.append({s["step"]: s["loss"] for s in list(inspection.log.steps.rows())})
    assert sorted(losses[0]) == sorted(losses[1]) == [1, 2]
    assert all(abs(losses[0][k] - losses[1][k]) <= 1e-5 for k in losses[0]), losses
    # the baseline really ran without it
    assert not [r for r in _calls_lines(baseline_run[0]["log"]) if r["name"].startswith("torch_rope_override")]


@pytest.mark.slow
def test_resumed_run_with_the_example_override_reports_its_calls(tmp_path, tiny_assets):
    """A resumed run's checkpoint load takes an optimizer step before any forward: the example's
    [OverrideCalls] line must still count the resumed run's calls, and inspect-logs judge it ran."""
    import os

    from trnqwen.fetch.builtin import tiny_qwen3_config

    env = {
        "PYTHONPATH": os.pathsep.join([str(TORCH_ROPE_DIR), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
    }
    args = ["--backend", "native", "--model", "builtin:tiny-qwen3", "--assets", str(tiny_assets), "--device", "cpu",
            "--nproc-per-node", "1", "--steps", "3", "--seq-len", "256", "--checkpoint-dir", "ckpt",
            "--override-imports", "torch_rope_override.torch_rope"]
    stopped = run_subprocess("train", *args, env={**env, "TRNQWEN_FAULT_PREEMPT_AT_STEP": "1"}, cwd=tmp_path, timeout=600)
    assert stopped.code == 138, stopped.text[-3000:]
    resumed = run_subprocess("train", "--resume", "--json", env=env, cwd=tmp_path, timeout=600)
    assert resumed.code == 0, resumed.text[-3000:]
    outcome = json.loads(resumed.out)
    n_layers = tiny_qwen3_config()["num_hidden_layers"]
    lines = [r for r in _calls_lines(outcome["log"]) if r["name"] == "torch_rope_override.torch_rope"]
    assert len(lines) == 2, lines  # one per process: the first run's and the resumed run's
    assert all(r["calls"] > 0 and r["fallbacks"] == 0 and r["modules"] == n_layers for r in lines), lines
    shown = run_subprocess("inspect-logs", outcome["run_dir"], "--json", cwd=tmp_path)
    assert shown.code == 0, shown.text[-3000:]
    report = json.loads(shown.out)
    assert report["resumes"] and report["overrides"]["torch_rope_override.torch_rope"]["calls"] > 0
    codes = {(f["code"], f["severity"]) for f in report["findings"] if "torch_rope_override" in f["message"]}
    assert ("override-ran", "info") in codes and not [c for c in codes if c[1] != "info"], codes


# --- (3) the NKI example against test doubles ---------------------------------------------------


def test_nki_example_imports_and_registers_operators(nki_example):
    import torch

    assert hasattr(torch.ops.my_kernels, "rope_fwd") and hasattr(torch.ops.my_kernels, "rope_bwd")
    from torchtitan.config.override import _REGISTRY

    ov = _REGISTRY["my_neuron_kernels.nki_rope"]
    assert ov.exact is True and ov.fqns == ["*layers.*.attention.rope"]
    assert ov.matches("model_spec.model.layers.7.attention.rope")
    partial = _REGISTRY["my_neuron_kernels.nki_rope_layers_10_19"]
    assert partial.matches("model_spec.model.layers.12.attention.rope")
    assert not partial.matches("model_spec.model.layers.2.attention.rope")
    assert not partial.matches("model_spec.model.layers.20.attention.rope")


def test_nki_seq_len_check_rejects_300_at_lnc2(nki_example, monkeypatch):
    with pytest.raises(ValueError, match=r"multiple of 256 \(128 x LNC=2\), got 300; use --seq-len 256 or 512"):
        nki_example.check_seq_len(300, lnc=2)
    nki_example.check_seq_len(512, lnc=2)
    nki_example.check_seq_len(384, lnc=1)
    with pytest.raises(ValueError):
        nki_example.check_seq_len(384, lnc=2)
    # the LNC comes from torch_neuronx.utils.get_logical_neuron_cores() when not given
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with pytest.raises(ValueError, match="got 300"):
        nki_example.check_seq_len(300)
    # the override factory refuses it when told the training length...
    with pytest.raises(ValueError, match="got 300"):
        nki_example.nki_rope(_titan_rope(), seq_len=300)
    assert type(nki_example.nki_rope(_titan_rope(), seq_len=2048)) is nki_example.NKIRoPE.Config


def test_nki_rope_falls_back_where_the_kernel_cannot_tile_counted_and_named(nki_example, monkeypatch):
    """seq 300 at LNC=2: never launched (the kernel would assert), torchtitan's rotation instead,
    counted as a fallback with the reason; a tileable length runs the kernel again."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    titan = _titan_rope().build()
    rope = nki_example.NKIRoPE.Config(dim=32, max_seq_len=512, theta=1e6, override_name="test.nki_300").build()
    q, k = _qk(seq=300)
    for got, ref in zip(_rope_results(rope, q, k), _rope_results(titan, q, k)):
        assert (got - ref).abs().max().item() == 0.0
    assert _calls(rope) == (0, 1)
    line = rope.counter.line()
    assert " calls=0 fallbacks=1 modules=0 " in line
    assert line.endswith("reason: NKI rope_hf needs the sequence length to be a multiple of 256 (128 x LNC=2), "
                         "got 300; use --seq-len 256 or 512")
    rope(*_qk(seq=256))
    assert _calls(rope) == (1, 1)


@pytest.mark.parametrize("rows", ["per-row", "shared", "none"])
def test_nki_rope_with_per_document_positions_runs_the_kernel_and_matches(nki_example, monkeypatch, rows):
    """Packed documents (positions reset mid-window): the kernel runs with the gathered cache,
    [batch, seq, head_dim*2] (per-row positions) or [seq, head_dim*2]; forward and backward
    (rope_bwd through register_autograd) equal CosSinRoPE's exactly."""
    import torch

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    titan = _titan_rope().build()
    nki = nki_example.NKIRoPE.Config(dim=32, max_seq_len=512, theta=1e6, override_name=f"test.nki_{rows}").build()
    q, k = _qk(batch=3, seq=256)
    positions = {"per-row": _packed_positions(batch=3), "shared": _packed_positions(batch=1), "none": None}[rows]
    seen = []
    kernel = nki_example.rope_hf.func

    def recording_kernel(q, k, q_out, k_out, cos=None, sin=None, rope_cache=None, backward=False):
        seen.append((tuple(rope_cache.shape), backward))
        return kernel(q, k, q_out, k_out, cos=cos, sin=sin, rope_cache=rope_cache, backward=backward)

    monkeypatch.setattr(nki_example.rope_hf, "func", recording_kernel)
    got = _rope_results(nki, q, k, positions)
    ref = _rope_results(titan, q, k, positions)
    for r, g in zip(ref, got):
        assert g.shape == r.shape and (g - r).abs().max().item() == 0.0
    cache_shape = (3, 256, 64) if rows == "per-row" else (256, 64)
    assert seen == [(cache_shape, False), (cache_shape, True)]  # the forward and the backward kernel
    assert _calls(nki) == (1, 0) and nki.counter.name == f"test.nki_{rows}"
    assert torch.equal(nki.custom_calls, torch.tensor(1))


def test_nki_kernel_double_takes_the_batched_cache_like_rope_hf(nki_example):
    """nkilib's rope_hf: rope_cache is [optional(batch), seq, head_dim*2]; a 3-D cache gives
    each sequence of the batch its own table (same result as one 2-D call per row)."""
    import torch

    q, k = (t.transpose(1, 2).contiguous() for t in _qk(batch=2, seq=128))
    cache = _titan_rope().build().cache
    batched = torch.stack([cache[:128], cache[200:328]])
    call = nki_example.wrap_nki(nki_example.rope_hf)[(1,)]
    q_out, k_out = call(q, k, torch.empty_like(q), torch.empty_like(k), rope_cache=batched)
    for row in range(2):
        rq, rk = call(q[row:row + 1], k[row:row + 1], torch.empty_like(q[:1]), torch.empty_like(k[:1]),
                      rope_cache=batched[row])
        assert torch.equal(q_out[row:row + 1], rq) and torch.equal(k_out[row:row + 1], rk)
    with pytest.raises(AssertionError, match="batch size"):
        call(q, k, torch.empty_like(q), torch.empty_like(k), rope_cache=batched[:1].expand(3, -1, -1))


def test_nki_rope_module_matches_torchtitan_forward_and_backward(nki_example, monkeypatch):
    """Layout transposes, cache reshape and register_autograd wiring, checked through the
    kernel double (which computes the documented rope_hf formulas)."""
    import torch

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    titan = _titan_rope().build()
    nki = nki_example.NKIRoPE.Config(dim=32, max_seq_len=512, theta=1e6).build()
    q, k = _qk(seq=256)
    results = []
    for module in (titan, nki):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        out_q, out_k = module(qq, kk)
        (out_q.square().sum() + (out_k * torch.arange(32.0)).sum()).backward()
        results.append((out_q.detach(), out_k.detach(), qq.grad, kk.grad))
    for ref, got in zip(results[0], results[1]):
        assert got.shape == ref.shape
        assert (got - ref).abs().max().item() == 0.0


def test_nki_kernel_double_enforces_the_kernel_contract(nki_example):
    """The operator launched at LNC=2 on 128 tokens trips the kernel's own assert."""
    import torch

    q = torch.zeros(1, 2, 128, 32)
    cache = torch.zeros(128, 64)
    import torch_neuronx  # the double, imported by the fixture

    assert torch_neuronx.utils.get_logical_neuron_cores() in ("1", "2")
    with pytest.raises(AssertionError, match="multiple of 128 \\* LNC=2"):
        nki_example.wrap_nki(nki_example.rope_hf)[(2,)](q, q, q.clone(), q.clone(), rope_cache=cache)
    with pytest.raises(AssertionError, match="head_dim\\*2=64"):
        nki_example.wrap_nki(nki_example.rope_hf)[(1,)](q, q, q.clone(), q.clone(), rope_cache=cache[:, :32])
