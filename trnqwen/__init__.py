"""trnqwen: the fine-tune lifecycle of Qwen3 with torchtitan on AWS Trainium.

The package is a library first (``trnqwen.config``, ``trnqwen.errors``, ...);
``trnqwen.cli`` is a thin Typer layer over it.  Nothing here imports torch,
torchtitan or transformers at module load: those imports live inside the
functions that need them so ``trnqwen --help`` stays instant.
"""

__version__ = "0.1.0"
