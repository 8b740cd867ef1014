"""``qwen3_nki_moe_config`` as documented, built on torchtitan's own Qwen3 MoE config."""

from __future__ import annotations

from torchtitan.config import CompileConfig, ParallelismConfig
from torchtitan.models.qwen3 import model_registry
from torchtitan.models.qwen3.config_registry import qwen3_30b_a3b

CALLS: list[dict] = []  # every call's arguments, for tests that check the wiring


def _resize_moe(moe, num_experts: int, top_k: int) -> None:
    moe.num_experts = num_experts
    moe.router.num_experts = num_experts
    moe.router.top_k = top_k
    moe.router.gate.out_features = num_experts
    moe.routed_experts.inner_experts.num_experts = num_experts
    moe.routed_experts.token_dispatcher.num_experts = num_experts
    moe.routed_experts.token_dispatcher.top_k = top_k


def qwen3_nki_moe_config(
    flavor: str,
    *,
    compile_config: CompileConfig,
    n_layers: int,
    num_experts: int,
    top_k: int,
):
    if not isinstance(compile_config, CompileConfig):
        raise TypeError("compile_config must be a torchtitan CompileConfig")
    if top_k > num_experts:
        raise ValueError("top_k must not exceed num_experts")
    CALLS.append(
        dict(flavor=flavor, compile_config=compile_config, n_layers=n_layers, num_experts=num_experts, top_k=top_k)
    )
    config = qwen3_30b_a3b() if flavor == "30B-A3B" else None
    if config is None:
        raise ValueError(f"unsupported flavor {flavor!r}")
    spec = model_registry(flavor)
    spec.model.layers = spec.model.layers[:n_layers]
    for layer in spec.model.layers:
        _resize_moe(layer.moe, num_experts, top_k)
    config.model_spec = spec
    config.compile = compile_config
    config.parallelism = ParallelismConfig(
        data_parallel_shard_degree=-1, tensor_parallel_degree=1, expert_parallel_degree=1
    )
    return config
