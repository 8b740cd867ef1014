"""``trnqwen serve``: an OpenAI-compatible server for an export (a whole model, or base + adapter).

plan.py  RUN|FOLDER -> what is served, the engine (vllm on Neuron, transformers elsewhere), vLLM's
         LoRA rules checked, the command as data (``--dry-run`` prints it);
process.py  runs it: the child started, the endpoint polled until it answers, Ctrl-C forwarded.
"""
