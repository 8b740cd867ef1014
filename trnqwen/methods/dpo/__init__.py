"""Direct Preference Optimization (Rafailov et al. 2023): preference pairs against reference log-probs.

Everything DPO is in this folder (docs/preference.md, docs/architecture.md "DPO"):

* ``settings``: ``beta`` and ``dpo_loss`` (sigmoid | ipo), their help and bounds;
* ``plan``: refusals, the reference key, the torchtitan config module's lines;
* ``loss``: the arithmetic every backend shares (segment log-prob sums, sigmoid/IPO, rewards, meter);
* ``reference_pass``: the reference log-probs, computed once in the ranks before step 1;
* ``titan``: the torchtitan ranks' loss and trainer hook;
* ``hf_trainer``: the hf-trainer backend's rows, loss, validation and ``[DPO]`` lines;
* ``log_lines``: the ``[DPO]`` lines (written by the ranks; read, summarised and tabled for inspect-logs);
* ``judge``: the judge's rules (step-1 loss = ln 2 for sigmoid);
* ``eval_report``: what ``trnqwen eval`` reports on pairs (preference accuracy, rewards);
* ``quickstart``: the quickstart's DPO stage;
* ``card``: the model card's section;
* ``examples``: its lines in ``trnqwen train --help`` and ``trnqwen data --help``.
"""

from trnqwen.methods.base import Example, Method, Metric

METHOD = Method(
    name="dpo",
    help="preference pairs",
    data="preference",
    settings="trnqwen.methods.dpo.settings:DpoSettings",
    metrics=(
        Metric("dpo/rewards_chosen", "rewards chosen", ".4f", panel="rewards",
               help="beta x (log pi - log ref) of the chosen answers, mean over the step's pairs"),
        Metric("dpo/rewards_rejected", "rewards rejected", ".4f", panel="rewards",
               help="beta x (log pi - log ref) of the rejected answers"),
        Metric("dpo/margin", "margin", ".3f", status=True, panel="rewards", help="rewards chosen - rejected"),
        Metric("dpo/accuracy", "acc", ".2f", status=True, panel="rewards:right",
               help="share of pairs whose chosen reward is the higher"),
    ),
    lr=(1e-6, "default for DPO (TRL's)"),
    lora_lr=(5e-6, "default for LoRA DPO (LLaMA-Factory's Qwen3 example)"),
    token_loss=False,  # a preference loss: ln 2 at step 1, not ln(vocab)
    plan="trnqwen.methods.dpo.plan:plan",
    hf_trainer="trnqwen.methods.dpo.hf_trainer:DPOHooks",
    judge="trnqwen.methods.dpo.judge:rules",
    log_lines="trnqwen.methods.dpo.log_lines",
    eval_report="trnqwen.methods.dpo.eval_report",
    quickstart="trnqwen.methods.dpo.quickstart",
    card="trnqwen.methods.dpo.card:card",
    docs="docs/preference.md",
    examples=(
        Example("train", "trnqwen train --backend hf-v5 --finetune --method dpo --beta 0.1 --dataset prefs.jsonl",
                "preference tuning on prompt/chosen/rejected pairs; step 1 is ln 2 (docs/preference.md)"),
        Example("data", "trnqwen data prefs.jsonl --method dpo", "preference pairs: kept/dropped, tokens, one pair"),
    ),
)
