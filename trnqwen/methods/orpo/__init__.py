"""ORPO, Odds Ratio Preference Optimization (Hong et al. 2024): preference pairs, reference-free.

The chosen answer's NLL plus lambda times the odds-ratio term, from the policy's own forward only:
no reference model and no reference pass (on Trainium: a whole forward over the data saved).
Everything ORPO is in this folder (docs/preference.md "ORPO"):

* ``settings``: ``orpo_lambda`` (``--orpo-lambda``), its help and bounds;
* ``plan``: refusals, the torchtitan config module's lines (loss, pair rows, hook);
* ``loss``: the arithmetic every backend shares (on :mod:`trnqwen.methods.pairs`);
* ``titan``: the torchtitan ranks' loss and trainer hook (and the ``[ORPO]`` line);
* ``hf_trainer``: the hf-trainer backend's rows, loss and validation;
* ``judge``: the judge's rule (step-1 loss a finite number above 0);
* ``eval_report``: what ``trnqwen eval`` reports on pairs (preference accuracy from mean log-probs);
* ``card``: the model card's section.
"""

from trnqwen.methods.base import Example, Method, Metric

METHOD = Method(
    name="orpo",
    help="preference pairs, reference-free: chosen NLL + odds ratio",
    data="preference",
    settings="trnqwen.methods.orpo.settings:OrpoSettings",
    metrics=(
        Metric("orpo/nll", "nll", ".4f", status=True, panel="orpo",
               help="mean NLL per token of the chosen answers, mean over the step's pairs"),
        Metric("orpo/log_odds_ratio", "log odds ratio", ".4f", panel="orpo",
               help="log sigmoid(log odds chosen vs rejected), mean over pairs: the term lambda weighs"),
        Metric("orpo/log_odds", "log odds", ".4f", panel="orpo:right",
               help="log odds(chosen) - log odds(rejected) of the mean token log-probs, mean over pairs"),
        Metric("orpo/rewards_chosen", "rewards chosen", ".4f", panel="rewards",
               help="lambda x mean token log-prob of the chosen answers, mean over pairs"),
        Metric("orpo/rewards_rejected", "rewards rejected", ".4f", panel="rewards",
               help="lambda x mean token log-prob of the rejected answers"),
        Metric("orpo/margin", "margin", ".4f", status=True, panel="rewards", help="rewards chosen - rejected"),
        Metric("orpo/accuracy", "acc", ".2f", status=True, panel="rewards:right",
               help="share of pairs whose chosen reward is the higher"),
    ),
    lr=(1e-6, "default for ORPO (TRL's ORPOConfig, as DPO's)"),
    lora_lr=(5e-6, "default for LoRA ORPO (as LoRA DPO's)"),
    token_loss=False,  # the odds-ratio term rides on the NLL: judged by its own rule, not ln(vocab)
    plan="trnqwen.methods.orpo.plan:plan",
    hf_trainer="trnqwen.methods.orpo.hf_trainer:ORPOHooks",
    judge="trnqwen.methods.orpo.judge:rules",
    eval_report="trnqwen.methods.orpo.eval_report",
    card="trnqwen.methods.orpo.card:card",
    docs="docs/preference.md",
    examples=(
        Example("train", "trnqwen train --backend hf-v5 --finetune --method orpo --orpo-lambda 0.1 --dataset prefs.jsonl",
                "the same pairs reference-free: chosen NLL + lambda x odds ratio, no reference pass"),
    ),
)
