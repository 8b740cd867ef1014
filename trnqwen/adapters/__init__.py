"""Adapters: what trains *beside* a frozen base instead of the base itself, one folder each (LoRA).

An adapter is a folder, as a training method is (``trnqwen/methods/``): its launcher-side plan, its
in-rank code for each backend, the readers of its log line and its quickstart stage live in it;
what the launcher, the ranks and the readers must agree on stays in ``trnqwen/contract/`` (for
LoRA: the spec the ranks get and the ``[LoRA]`` line, ``contract/lora.py``; the PEFT folder it
exports, ``contract/peft_adapter.py``), and the checks of that folder stay with verify-ckpt and
merge in ``trnqwen/ckpt/``.

Layering: ``runtime < adapters < methods``.  An adapter imports the base modules, ``contract/`` and
``runtime/``; a method may import it (GRPO's reference switches LoRA's B matrices off); ``train/``,
``logs/``, ``ckpt/`` and ``quickstart/`` import it; ``runtime/`` never does: the generated torchtitan
config module imports the adapter's code and trainer hook itself, and the hf-trainer spec names
the adapter's module by dotted path.  What an adapter needs from a layer above it (the merge in a
child process, the quickstart's ``StageFailed``) is handed in.
"""
