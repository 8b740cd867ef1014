"""``trnqwen quickstart``: the whole lifecycle on the built-in tiny Qwen3, on this machine.

No network, no accelerator, in a working folder of its own (default ``./trnqwen-quickstart``):

  1. check-env      the same probe as ``trnqwen check-env`` (nothing may block training here)
  2. fetch          ``builtin:tiny-qwen3``: a complete HF snapshot, made offline
  3. pre-train      a short run from random init (native backend) that exports HF safetensors
  4. snapshot       those weights + the model's config and tokenizer = a "published" model
  5. fine-tune      ``train --finetune`` from that snapshot with each backend (native, hf-v5,
                    hf-trainer), each through the real launcher: torchrun, run dir, logs
     override       the native fine-tune again with the custom-kernel example's CPU twin
                    (``examples/torch_rope``): its rotation must run on every layer with no
                    fallback (its ``[OverrideCalls]`` line) and give the native run's losses
  6. verify-ckpt    every exported checkpoint: keys/shapes/dtypes, NaN/Inf scan, round trip
  7. inspect-logs   every run judged; the fine-tunes' step-1 loss must sit far below the
                    random-init run's (the recipe's 6.54 vs 12.43), and a loss plot is written
  8. chat fine-tune on the bundled chat set, then ``trnqwen eval``: held-out loss must fall
  9. LoRA fine-tune the chat set again as a LoRA adapter, merged and verified
 10. each training method's own stage (``trnqwen/methods/<name>/quickstart.py``), e.g. the
                    snapshot preference-tuned on the bundled pairs: step-1 loss ln 2, then
                    ``trnqwen eval``: held-out preference accuracy must rise

Everything written stays under the working folder; a rerun starts the runs afresh (the fetched
snapshot is reused).  :func:`run_quickstart` is the library call; the CLI prints its result.
Core library: no typer; torch is only imported by the checks that need it.
"""

from trnqwen.quickstart.progress import Progress  # noqa: F401
from trnqwen.quickstart.report import SUMMARY_COLUMNS, compare_losses, summary_rows, write_loss_plot  # noqa: F401
from trnqwen.quickstart.stages import (  # noqa: F401
    OVERRIDE_SKIPPED, check_override_ran, inspect_run, make_snapshot, override_example_dir, prepare_workdir,
    run_config, run_quickstart, stage_check_env, stage_fetch, train_run, verify_checkpoint,
)
from trnqwen.quickstart.types import (  # noqa: F401
    DEFAULT_WORKDIR, FINETUNE_BACKENDS, MARKER, NEXT_COMMANDS, QuickstartResult, RunInfo, Stage, StageFailed,
    result_of,
)
