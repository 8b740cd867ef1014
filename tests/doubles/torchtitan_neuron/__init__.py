"""Test double of torchtitan-neuron: only the config entry point trnqwen's nki-moe recipe calls.

It builds the config the documented way (recipe.md, backend 3) on top of the REAL torchtitan
Qwen3 config: Qwen3 ``30B-A3B`` cut to ``n_layers`` layers with ``num_experts`` experts routed
``top_k`` per token, 64-way FSDP (``data_parallel_shard_degree=-1``), TP 1, no expert
parallelism, and the given ``CompileConfig``.  What the real package adds on Trainium (NKI
grouped experts, SDPA, a gather-free rotary embedding) needs Neuron kernels and is not imitated.
"""

__version__ = "0.0.0+trnqwen.testdouble"
IS_TEST_DOUBLE = True
