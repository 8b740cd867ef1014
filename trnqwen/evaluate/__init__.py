"""``trnqwen eval``: did the fine-tune help?  Held-out loss and answers, base and tuned side by side.

    from trnqwen.evaluate.run import plan_eval, execute
    plan = plan_eval(["checkpoint_tiny_qwen3_ft/step-20"], runs_dir=Path(".trnqwen/runs"))
    report = execute(plan)                       # EvalReport; report.to_json()

Modules: ``targets`` (CHECKPOINT / run dir / run id -> model folders, the base), ``data`` (the
tokenized cache's rows, exactly what training read; held-out prompts), ``model`` (load in the
checkpoint's dtype, token-weighted loss, greedy answers, free), ``report`` (table, JSON),
``run`` (checks first, then one model at a time).  No module imports torch at import time.
"""
