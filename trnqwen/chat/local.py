"""In-process answers: the export loaded as ``trnqwen eval`` loads it, streamed by transformers.

The model comes from :func:`trnqwen.evaluate.model.load_model` (its saved dtype, the device, a LoRA
adapter on its base through peft, unmerged); the tokenizer and its chat template from the adapter
when it carries one (a run trained with ``--chat-template`` writes it there), else from beside the
weights.  Each turn renders the whole conversation with the chat template (``enable_thinking``
passed through), and ``generate()`` runs in a thread feeding transformers' own
``TextIteratorStreamer``, whose decoded pieces are yielded as they come.  Temperature 0 is greedy
decoding with the options ``eval --generate`` uses, so the answer is the one it gives.  Stopping
early (Ctrl-C) sets a flag a stopping criterion reads at the next token; the thread is joined.
torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from trnqwen.chat.session import Sampling
from trnqwen.errors import UsageError
from trnqwen.evaluate.targets import EvalTarget


def tokenizer_dir(target: EvalTarget) -> Path:
    """The adapter's own tokenizer (the chat template its run trained with), else the model's."""
    from trnqwen.assets import has_tokenizer

    if target.adapter is not None and has_tokenizer(target.adapter):
        return target.adapter
    return target.tokenizer_dir


def generation_options(sampling: Sampling, *, eos_ids: list[int], pad_id: int, device_type: str) -> dict[str, Any]:
    """``generate()``'s keyword arguments for one answer.  Temperature 0: greedy, the sampling knobs
    cleared (a generation_config.json's temperature would otherwise warn); a temperature: sampling;
    none: the model's generation config decides, ``top_p`` overriding it when given."""
    options: dict[str, Any] = {"max_new_tokens": sampling.max_new_tokens, "pad_token_id": pad_id, "eos_token_id": eos_ids}
    if sampling.greedy:
        options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    elif sampling.temperature is not None:
        options.update(do_sample=True, temperature=sampling.temperature)
    if sampling.top_p is not None and not sampling.greedy:
        options["top_p"] = sampling.top_p
    if device_type == "neuron":
        options["cache_implementation"] = "static"  # the Transformers Neuron rule (as eval's answers)
    return options


class LocalEngine:
    """A loaded model and its tokenizer; :meth:`stream` answers one conversation."""

    def __init__(self, model, tokenizer, *, description: str, device_type: str):
        from trnqwen.evaluate.model import eos_ids_of

        self.model = model
        self.tokenizer = tokenizer
        self.description = description
        self.device_type = device_type
        self.eos_ids = eos_ids_of(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    def render(self, messages: list[dict[str, str]], sampling: Sampling) -> str:
        """The conversation as the model reads it: the chat template, the assistant's turn opened."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  **sampling.template_kwargs())

    def stream(self, messages: list[dict[str, str]], sampling: Sampling) -> Iterator[str]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        prompt = self.render(messages, sampling)
        inputs = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)  # the template wrote them
        if self.device_type not in ("neuron", "cpu"):  # Neuron: inputs stay on the CPU (generate moves them)
            inputs = inputs.to(self.model.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        stop = threading.Event()

        class Stopped(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool)

        options = generation_options(sampling, eos_ids=self.eos_ids, pad_id=self.pad_id, device_type=self.device_type)
        failed: list[BaseException] = []

        def work() -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(**inputs, streamer=streamer, stopping_criteria=StoppingCriteriaList([Stopped()]),
                                        **options)
            except BaseException as exc:  # handed to the reader: a thread's exception is otherwise lost
                failed.append(exc)
                streamer.end()

        thread = threading.Thread(target=work, name="trnqwen-chat-generate", daemon=True)
        thread.start()
        try:
            for piece in streamer:
                yield piece
        finally:
            stop.set()
            thread.join()
        if failed:
            exc = failed[0]
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            from trnqwen.errors import CheckFailed

            raise CheckFailed(f"generation failed: {type(exc).__name__}: {first}")


def open_local(target: EvalTarget, *, device_type: str, trust_remote_code: bool = False,
               on_load: Optional[Callable[[EvalTarget], None]] = None) -> LocalEngine:
    """The target's model and tokenizer loaded; a tokenizer without a chat template is refused first."""
    from transformers import AutoTokenizer

    from trnqwen.evaluate.model import load_model

    folder = tokenizer_dir(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UsageError(f"no usable tokenizer in {folder} ({str(exc).strip().splitlines()[0]})",
                         hint="chat with an export a finished run wrote (hf/step-N: tokenizer included)") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"the tokenizer in {folder} has no chat template, so a conversation cannot be rendered",
                         hint="train with --chat-template chatml, or add chat_template.jinja to the export")
    if on_load is not None:
        on_load(target)
    model = load_model(target, device_type, trust_remote_code=trust_remote_code)
    return LocalEngine(model, tokenizer, description=f"{target.label} (in this process, {device_type})",
                       device_type=device_type)
