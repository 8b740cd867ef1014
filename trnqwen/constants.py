"""Names shared by the core and the CLI, kept import-free so ``--help`` stays instant."""

BACKENDS: tuple[str, ...] = ("hf-v5", "native", "nki-moe", "hf-trainer")
DEVICES: tuple[str, ...] = ("auto", "neuron", "cuda", "cpu")
LAUNCHERS: tuple[str, ...] = ("local", "slurm", "k8s")
DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
BUILTIN_PREFIX = "builtin:"
TINY_MODEL = "builtin:tiny-qwen3"
CONFIG_FILE_NAME = "trnqwen.toml"


# LoRA targets, by their Hugging Face module names (the names peft, vLLM and users use);
# "all-linear" means all seven (never lm_head or the MoE router).  trnqwen.adapters.lora.plan maps them.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_ALL_LINEAR = "all-linear"
