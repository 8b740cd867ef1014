"""LoRA, in one place (docs/lora.md): ``--lora`` trains low-rank adapters on a frozen base and
exports them as a PEFT adapter folder.

* ``plan.py``: the launcher's side: the run config's adapter (:class:`~trnqwen.contract.lora.LoraSpec`),
  Hugging Face target names mapped onto each backend (or refused), the plan's line, the
  ``attach_lora`` call and trainer hook rendered into the generated torchtitan config module, the
  hf-trainer ranks' module, the preflight's LoRA checks, and the export checked (and merged) after the run;
* ``titan.py``: in the torchtitan ranks (native, hf-v5, nki-moe): torchtitan's ``LoRAConverter`` or
  adapters injected into the Transformers model, the base frozen after parallelize, the adapters
  initialised from (seed, HF name), the ``[LoRA]`` line, and :class:`~trnqwen.adapters.lora.titan.LoraHook`
  (the HF base load without adapter keys, the PEFT adapter as the HF export);
* ``hf_trainer.py``: in the hf-trainer ranks: peft's adapters, the same init, the same line and export;
* ``readers.py``: the ``[LoRA]`` line read back for inspect-logs (``--json``'s ``lora``, the table's
  row) and judged (did only the adapters train?), every rank's line from torchrun's per-rank logs;
* ``quickstart.py``: the quickstart's LoRA stage (train, judge the line and the held-out loss, merge).

The shared pieces are ``trnqwen/contract/lora.py`` (the spec, the line's format, target names,
adapter parameter counts) and ``trnqwen/contract/peft_adapter.py`` (the PEFT folder, the adapter
init, adapter key names); the folder's verification and the merge are ``trnqwen/ckpt/``'s
(``verify_adapter.py``, ``adapter_rules.py``, ``merge.py``): they are verify-ckpt's and merge's
checks on any PEFT folder, trained here or not, and import ``ckpt/``'s layout and scans.
"""
