"""Reading and judging torchtitan training logs (``trnqwen inspect-logs``).

``parse`` turns log lines (and structured JSONL / TensorBoard files) into records,
``judge`` turns a parsed run into findings, ``report`` renders tables/JSON/CSV/plots.
"""
