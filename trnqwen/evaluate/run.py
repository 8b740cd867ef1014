"""``trnqwen eval`` end to end: resolve every input first, then one model at a time.

Everything a user can get wrong (a missing checkpoint, a run id naming no run, an architecture
that is not the base's, data with no trained tokens, ``--generate`` without a chat template) is
checked before any model loads, so a mistake costs a second and writes nothing.  Then each model
is loaded, scored, asked for its answers and freed before the next one loads: base and tuned never
sit in memory together.  On the run's own validation split the report goes to ``<run dir>/eval.json``
of the tuned run (for ``inspect-logs``), its model card and, when the run tracks to TensorBoard, its
event files; on other data (``--dataset``) only to ``<run dir>/eval-<data>-<hash6>.json``.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from trnqwen.errors import UsageError
from trnqwen.methods import registry as methods
from trnqwen.evaluate.data import Conversation, EvalData, eval_data, held_out_conversations
from trnqwen.evaluate.report import EVAL_RECORD, EvalReport, EvalResult, Generation, other_data_record
from trnqwen.evaluate.targets import (
    EvalTarget,
    RunInfo,
    base_target,
    check_same_architecture,
    resolve_target,
    unique_labels,
)

DEFAULT_BATCH_SIZE = 4
DEFAULT_MAX_NEW_TOKENS = 128


@dataclass
class EvalPlan:
    """Everything resolved and checked; nothing loaded yet."""

    targets: list[EvalTarget]  # base first when there is one
    data: EvalData
    conversations: list[Conversation]
    device_type: str
    batch_size: int
    max_new_tokens: int
    trust_remote_code: bool = False
    record_dir: Optional[Path] = None  # the run dir eval.json goes to
    own_split: bool = True  # the run's own validation split (not --dataset): the only data that writes eval.json and the card
    # a method's own data (preference pairs): the method that scores it (trnqwen.methods.registry)
    # and the settings its numbers are computed with (the run's, else the defaults)
    method: Optional[str] = None
    method_settings: Optional[dict[str, Any]] = None
    answers: int = 0  # a method that answers held-out prompts itself (its eval_report's ``answers``): how many to show


def plan_eval(
    checkpoints: Sequence[str],
    *,
    runs_dir: Path,
    dataset: Optional[str] = None,
    base: Optional[bool] = None,
    base_dir: Optional[Path] = None,
    generate: int = 0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "auto",
    seq_len: Optional[int] = None,
    data_cache_dir: Optional[Path] = None,
    trust_remote_code: bool = False,
) -> EvalPlan:
    """Resolve checkpoints, base, data and prompts; raise :class:`UsageError` on bad input."""
    if generate < 0:
        raise UsageError(f"--generate must be >= 0 (got {generate})")
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1 (got {max_new_tokens})")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1 (got {batch_size})")
    if seq_len is not None and dataset is None:  # the run's validation split is already tokenized at its length
        raise UsageError(
            f"--seq-len {seq_len} applies only with --dataset: the run's own validation split keeps the run's sequence length",
            hint="drop --seq-len, or pass --dataset FILE to score other data at another length",
        )
    targets = plan_targets(checkpoints, runs_dir=Path(runs_dir), base=base, base_dir=base_dir)
    data = eval_data(dataset, targets, seq_len=seq_len, data_cache_dir=data_cache_dir)
    data.tokenizer_dir = targets[0].tokenizer_dir
    data.trust_remote_code = trust_remote_code
    record_run = next((t.run for t in targets if not t.is_base and t.run is not None), None)
    scoring = scoring_method(data, record_run or next((t.run for t in targets if t.run is not None), None))
    own_answers = bool(scoring) and hasattr(methods.load(methods.get(scoring["method"]).eval_report), "answers")
    conversations: list[Conversation] = []
    if generate and not own_answers:
        require_chat_template(targets[0])
        conversations = held_out_conversations(data, generate)
        if not conversations:
            raise UsageError(
                f"--generate: {data.name} has no conversation with a prompt and a trained answer",
                hint="--generate needs chat data (messages, ShareGPT, Alpaca, prompt/completion) trained on its answers",
            )
    return EvalPlan(
        targets=targets, data=data, conversations=conversations, device_type=detect_device_type(device),
        batch_size=batch_size, max_new_tokens=max_new_tokens, trust_remote_code=trust_remote_code,
        record_dir=record_run.run_dir if record_run else None, own_split=dataset is None, **scoring,
        answers=(generate or methods.load(methods.get(scoring["method"]).eval_report).ANSWERS) if own_answers else 0,
    )


def plan_targets(checkpoints: Sequence[str], *, runs_dir: Path, base: Optional[bool],
                 base_dir: Optional[Path]) -> list[EvalTarget]:
    """The models to evaluate, the base first when there is one; all the same architecture."""
    if base_dir is not None and not (Path(base_dir) / "config.json").is_file():
        raise UsageError(f"--base-dir {base_dir}: no config.json there",
                         hint="--base-dir must be the base model's HF snapshot (trnqwen fetch <model> downloads it)")
    targets = [resolve_target(arg, runs_dir, base_dir=base_dir) for arg in checkpoints] or [
        resolve_target(None, runs_dir, base_dir=base_dir)]
    reference = None
    if base is not False:
        reference = base_target(targets, base_dir)
        if reference is None and base:
            raise UsageError(
                "--base: no base model known (no checkpoint came from a recorded run)",
                hint="name it with --base-dir DIR, or drop --base",
            )
    if reference is not None:
        check_same_architecture(reference, targets)
        targets = [reference, *targets]
    else:
        check_same_architecture(targets[0], targets[1:])
    unique_labels(targets)
    return targets


def scoring_method(data: EvalData, run: Optional[RunInfo]) -> dict[str, Any]:
    """``{method, method_settings}`` of data a method scores itself (its ``eval_report``), else {}:
    the settings are the run's (run.json), else the defaults (RunConfig's)."""
    method = methods.find(data.method) if data.method else None
    if method is None or not method.eval_report:
        return {}
    from trnqwen.config import RunConfig

    config = (run.record.config or {}) if run is not None else {}
    defaults = {name: info.default for name, info in RunConfig.model_fields.items()}
    return {"method": method.name, "method_settings": methods.load(method.eval_report).settings(config, defaults)}


def require_chat_template(target: EvalTarget) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target.tokenizer_dir), trust_remote_code=False)
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(
            f"--generate: the tokenizer in {target.tokenizer_dir} has no chat template",
            hint="answers are generated with the model's chat template; use an instruct model's snapshot, or drop --generate",
        )


def detect_device_type(requested: str) -> str:
    from trnqwen.ckpt.generate import detect_device_type as _detect

    return _detect(requested)


# --- running ----------------------------------------------------------------------------------------


def execute(plan: EvalPlan, *, say: Optional[Callable[[str], None]] = None) -> EvalReport:
    """Each model in turn: load, score, answer, free.  Writes eval.json into the tuned run's dir."""
    from transformers import AutoTokenizer

    from trnqwen.evaluate import model as m

    report = EvalReport(dataset=plan.data.name, method=plan.method, method_settings=plan.method_settings)
    scorer = methods.load(methods.get(plan.method).eval_report) if plan.method else None
    tokenizer = AutoTokenizer.from_pretrained(str(plan.targets[0].tokenizer_dir), trust_remote_code=plan.trust_remote_code) if plan.conversations else None
    prompt_len = m.prompt_length(plan.conversations) if plan.conversations else 0
    answers: list[dict[str, str]] = [{} for _ in plan.conversations]
    base_scores = None  # the base's scores: the reference of the tuned models' numbers (rewards, reward_vs_base)
    shown: list[tuple[str, str, dict[str, str]]] = []  # a method's own answers: (prompt, reference, {label: answer})
    for target in plan.targets:
        started = time.perf_counter()
        model = m.load_model(target, plan.device_type, trust_remote_code=plan.trust_remote_code)
        numbers = None
        if scorer is not None:  # the method's own scores (held-out pairs, held-out prompts)
            scores = scorer.score(model, plan.data, batch_size=plan.batch_size, static_shapes=plan.device_type == "neuron",
                                  head_chunk=m.HEAD_CHUNK)
            numbers = scorer.numbers(scores, None if target.is_base else base_scores, plan.method_settings)
            own = scorer.loss(scores) if hasattr(scorer, "loss") else scores.chosen_loss()  # prompts: no loss of their own
            result = (m.LossResult(tokens=own.tokens, loss_sum=own.loss_sum) if own is not None
                      else m.LossResult(tokens=scorer.completion_tokens(scores), loss_sum=0.0))
            has_loss = own is not None
            base_scores = scores if target.is_base else base_scores
            if plan.answers:
                for n, (prompt, reference, text) in enumerate(scorer.answers(scores, plan.answers)):
                    if n == len(shown):
                        shown.append((prompt, reference, {}))
                    shown[n][2][target.label] = text
        else:
            result = m.score(model, plan.data, batch_size=plan.batch_size, static_shapes=plan.device_type == "neuron")
            has_loss = True
        if plan.conversations:
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else plan.data.pad_id
            generated = m.answer(
                model, plan.conversations, pad_id=pad_id, eos_ids=m.eos_ids_of(model, tokenizer), prompt_len=prompt_len,
                max_new_tokens=plan.max_new_tokens, batch_size=min(plan.batch_size, len(plan.conversations)),
                device_type=plan.device_type,
            )
            for slot, ids in zip(answers, generated):
                slot[target.label] = tokenizer.decode(ids, skip_special_tokens=True).strip()
        del model  # the last reference: base and tuned never sit in memory together
        m.release_memory()
        report.results.append(EvalResult(target.label, result.tokens, result.loss if has_loss else None,
                                         result.perplexity if has_loss else None, preference=numbers))
        if say is not None:
            what = f"loss {result.loss:.4f} on {result.tokens:,} tokens"
            if numbers is not None and hasattr(scorer, "say"):  # its own line (held-out prompts: no loss)
                what = scorer.say(numbers)
            elif numbers is not None:
                what = (f"preference accuracy {numbers['preference_accuracy']:.4f}, margin {numbers['margin']:+.4f}, "
                        f"chosen-answer {what}")
            say(f"{target.label}: {what} ({time.perf_counter() - started:.1f}s)")
    base = report.base
    for r in report.results:
        if base is not None and r is not base and r.loss is not None and base.loss is not None:
            r.delta_vs_base = r.loss - base.loss
    for prompt, reference, slot in shown:
        report.generations.append(Generation(prompt=prompt, reference=reference, answers=slot,
                                             conversation=[{"role": "user", "content": prompt}]))
    for conversation, slot in zip(plan.conversations, answers):
        prompt, turns = prompt_turns(tokenizer, conversation.prompt_ids)
        report.generations.append(
            Generation(
                prompt=prompt,
                reference=tokenizer.decode(conversation.reference_ids, skip_special_tokens=True).strip(),
                answers=slot,
                conversation=turns,
            )
        )
    if plan.record_dir is not None:
        tuned = next(t for t in plan.targets if not t.is_base and t.run is not None and t.run.run_dir == plan.record_dir)
        last = (tuned.run.record.extra.get("summary") or {}).get("last_step")
        step = (last.get("step") if isinstance(last, dict) else None) or tuned.run.record.steps
        try:
            if plan.own_split:
                record(plan.record_dir, report, step=step, folder=tuned.export, run=tuned.run)
            else:  # other data: reported and kept under its own name, never as the run's held-out numbers
                from trnqwen.fsutil import write_json_atomic

                saved = Path(plan.record_dir) / other_data_record(plan.data.name)
                write_json_atomic(saved, {**report.to_json(), "step": step, "evaluated_at": time.time()})
                if say is not None:
                    say(f"results on {plan.data.name} saved to {saved} (the run's eval.json and model card keep its own split)")
        except OSError as exc:  # a read-only run dir or export: the results are still printed
            from trnqwen import output

            output.warn(f"could not record the results in {plan.record_dir}: {exc.strerror or exc}")
    return report


_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.DOTALL)


def prompt_turns(tokenizer, prompt_ids: list[int]) -> tuple[str, list[dict[str, str]]]:
    """(the last user message, every turn before the answer) of a ChatML prompt as the model got it:
    the system prompt and the earlier turns too.  Not ChatML: the prompt without special tokens, no turns."""
    rendered = tokenizer.decode(prompt_ids, skip_special_tokens=False)
    turns = [{"role": role, "content": content.strip()} for role, content in _TURN.findall(rendered)]
    users = [t["content"] for t in turns if t["role"] == "user"]
    if users:
        return users[-1], turns
    return tokenizer.decode(prompt_ids, skip_special_tokens=True).strip(), []


def record(
    run_dir: Path, report: EvalReport, *, step: Optional[int] = None, folder: Optional[Path] = None, run: Optional[RunInfo] = None
) -> None:
    """``<run dir>/eval.json`` (atomic), and the losses into the run's TensorBoard events if any."""
    from trnqwen.fsutil import write_json_atomic
    from trnqwen.train.tracking import log_eval, log_eval_wandb

    results = report.to_json()["results"]
    payload: dict[str, Any] = {**report.to_json(), "step": step, "evaluated_at": time.time()}
    write_json_atomic(Path(run_dir) / EVAL_RECORD, payload)
    log_eval(Path(run_dir), results, step if isinstance(step, int) else None)
    if run is not None:
        log_eval_wandb(Path(run_dir), run.record.config or {}, results, step if isinstance(step, int) else None)
    if folder is not None and run is not None:
        rewrite_card(run, folder, results, report.dataset)


def rewrite_card(run: RunInfo, folder: Path, results: Optional[list[dict[str, Any]]] = None,
                 dataset: Optional[str] = None) -> None:
    """The export's model card again, from the run's record: the held-out table (``results``, else
    the run's eval.json) and the benchmarks (its eval-harness.json); only a card trnqwen wrote."""
    import json

    from trnqwen.ckpt.model_folder import card_info, write_model_card
    from trnqwen.contract.peft_adapter import is_adapter_folder, read_adapter_config

    if not run.record.assets_dir:
        return
    if results is None:
        try:
            saved = json.loads((Path(run.run_dir) / EVAL_RECORD).read_text(encoding="utf-8"))
            results, dataset = saved.get("results"), saved.get("dataset")
        except (OSError, ValueError):
            results = None
    info = card_info(run.record, results, dataset)
    if is_adapter_folder(folder):  # the card of a PEFT adapter stays one (library_name: peft)
        info.adapter = read_adapter_config(folder)
    write_model_card(folder, info)


def run_eval(
    checkpoints: Sequence[str],
    *,
    run_flags: dict[str, Any],
    config_file: Optional[Path] = None,
    dataset: Optional[str] = None,
    base: Optional[bool] = None,
    base_dir: Optional[Path] = None,
    generate: int = 0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    json_out: bool = False,
) -> EvalReport:
    """The whole command: config -> plan (all checks) -> execute -> table or JSON."""
    from trnqwen import output
    from trnqwen.config import resolve_config

    resolved = resolve_config(
        run_flags, config_file=config_file, uses={"runs_dir", "device", "data_cache_dir", "trust_remote_code", "seq_len"}
    )
    for w in resolved.warnings:
        output.warn(w)
    cfg = resolved.config
    plan = plan_eval(
        checkpoints, runs_dir=Path(cfg.runs_dir), dataset=dataset, base=base, base_dir=base_dir, generate=generate,
        max_new_tokens=max_new_tokens, batch_size=batch_size, device=cfg.device,
        seq_len=run_flags.get("seq_len"), data_cache_dir=cfg.data_cache_dir, trust_remote_code=cfg.trust_remote_code,
    )
    say = None if json_out or not sys.stderr.isatty() else output.info
    if say is not None:
        say(f"evaluating {len(plan.targets)} model(s) on {plan.data.name} ({plan.data.trained_tokens:,} trained tokens, {plan.device_type})")
    report = execute(plan, say=say)
    if json_out:
        output.print_json(report.to_json())
    else:
        from trnqwen.evaluate.report import render

        render(report)
        line = report.summary_line()
        if line:
            output.info(line)
    return report
