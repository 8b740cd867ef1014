"""Names shared by the core and the CLI, kept import-free so ``--help`` stays instant."""

BACKENDS: tuple[str, ...] = ("hf-v5", "native", "nki-moe", "hf-trainer")
DEVICES: tuple[str, ...] = ("auto", "neuron", "cuda", "cpu")
LAUNCHERS: tuple[str, ...] = ("local", "slurm", "k8s")
DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
BUILTIN_PREFIX = "builtin:"
TINY_MODEL = "builtin:tiny-qwen3"
CONFIG_FILE_NAME = "trnqwen.toml"
