"""``trnqwen eval --tasks``: lm-evaluation-harness benchmarks of the base and the fine-tune, side by side.

The harness (EleutherAI's ``lm_eval``, the ``eval`` extra) does the scoring, not a copy of it:
each model is loaded the way ``trnqwen eval`` loads it (an export, or base + LoRA adapter, in its
own dtype), handed to the harness's own ``HFLM`` wrapper and scored by ``simple_evaluate``; one
model at a time, freed before the next.  A task is

* ``trnqwen_calculator``: trnqwen's own (held-out calculator questions, right answer among three
  wrong ones, ``acc``; data shipped in the package: offline, about a minute on a CPU);
* a harness task or group name (``gsm8k``, ``ifeval``...);
* the path of a task YAML file (local data as the harness allows; its folder is searched for the
  files it includes).

A task whose data must be downloaded is refused in one line when the Hub is offline
(``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``), before any model loads.  Chat-tuned models (a
tokenizer with a chat template) are scored through their template, and the report says so.
``--fail-below TASK=DELTA`` is a gate: the tuned model may not lose more than ``-DELTA`` on
``TASK`` against the base (exit 1).  Results go to ``<run dir>/eval-harness.json``; the run's own
``eval.json`` (its held-out loss) is never touched.  ``--endpoint URL`` (and ``--base-endpoint``)
score generative tasks through a running OpenAI-compatible server instead (:mod:`.endpoint`).
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from trnqwen.errors import CheckFailed, EnvironmentProblem, UsageError
from trnqwen.ckpt.model_folder import HARNESS_RECORD
from trnqwen.evaluate.endpoint import Endpoint
from trnqwen.evaluate.targets import EvalTarget, RunInfo

BUILTIN_TASK = "trnqwen_calculator"
BUILTIN_GEN_TASK = "trnqwen_calculator_gen"  # the same questions answered greedily: what an endpoint can score
INSTALL_HINT = "install the harness: pip install 'trnqwen[eval]' (lm_eval)"
_LOCAL_LOADERS = ("json", "csv", "parquet", "text", "arrow")  # dataset_path values that read local files


@dataclass
class HarnessTask:
    """One ``--tasks`` entry: its name, and its config when trnqwen builds it (else the harness's)."""

    name: str
    config: Optional[dict[str, Any]] = None
    yaml: Optional[Path] = None


@dataclass
class TaskScore:
    task: str
    metric: str  # "acc", "exact_match,strict-match"
    value: float
    stderr: Optional[float]
    samples: Optional[int]


@dataclass
class HarnessResult:
    label: str
    is_base: bool
    scores: dict[str, TaskScore] = field(default_factory=dict)
    seconds: float = 0.0
    endpoint: Optional[str] = None  # scored through this server (--endpoint), not loaded here
    answers: dict[str, list[str]] = field(default_factory=dict)  # generative tasks' answers in doc order (--json)


@dataclass
class HarnessReport:
    tasks: list[str]
    limit: Optional[float]
    chat_template: bool
    results: list[HarnessResult] = field(default_factory=list)  # base first when there is one

    @property
    def base(self) -> Optional[HarnessResult]:
        return next((r for r in self.results if r.is_base), None)

    def deltas(self, result: HarnessResult) -> dict[str, float]:
        """``task -> tuned - base`` (empty without a base)."""
        base = self.base
        if base is None or result is base:
            return {}
        return {t: s.value - base.scores[t].value for t, s in result.scores.items() if t in base.scores}

    def to_json(self, *, answers: bool = True) -> dict[str, Any]:
        results = []
        for r in self.results:
            entry = {**asdict(r), "delta_vs_base": self.deltas(r) or None}
            if not answers or not r.answers:
                entry.pop("answers")
            results.append(entry)
        return {"tasks": self.tasks, "limit": self.limit, "chat_template": self.chat_template, "results": results}


# --- tasks -----------------------------------------------------------------------------------------


def builtin_task_config(name: str = BUILTIN_TASK) -> dict[str, Any]:
    """trnqwen's own tasks as harness task configs (their data file is in the package):
    ``trnqwen_calculator`` scores the right sentence's log-likelihood among four (``acc``);
    ``trnqwen_calculator_gen`` asks for the answer greedily and compares it whole, whitespace around it
    aside (``exact_match,stripped``), which is what a chat endpoint can be scored on."""
    from trnqwen.data.harness_recipe import task_path

    common = {
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(task_path())}},
        "test_split": "test",
        "doc_to_text": "{{question}}",
        "metadata": {"version": 1.0},
    }
    if name == BUILTIN_GEN_TASK:
        return {
            **common, "task": name, "output_type": "generate_until", "doc_to_target": "{{choices[gold]}}",
            "generation_kwargs": {"until": ["<|im_end|>"], "do_sample": False, "max_gen_toks": 64},
            # the answer without surrounding whitespace: an OpenAI-compatible server may drop the
            # leading newlines a model writes (transformers serve does), the in-process model keeps them
            "filter_list": [{"name": "stripped", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
            "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                             "ignore_case": True, "ignore_punctuation": True}],
        }
    return {
        **common, "task": name, "output_type": "multiple_choice", "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{gold}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }


def split_tasks(values: Sequence[str]) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (order kept, duplicates dropped)."""
    names: list[str] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if name and name not in names:
                names.append(name)
    return names


def offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _needs_download(config: dict[str, Any]) -> Optional[str]:
    """What a task config would download (its ``dataset_path``), None when its data is local."""
    path = str(config.get("dataset_path") or "")
    if not path or path in _LOCAL_LOADERS or Path(path).expanduser().exists() or _in_datasets_cache(path):
        return None
    return path


def _in_datasets_cache(path: str) -> bool:
    """Whether ``datasets`` has this Hub dataset in its cache already (then it loads offline)."""
    root = os.environ.get("HF_DATASETS_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "datasets")
    return any(Path(root).glob(path.replace("/", "___") + "*"))


def resolve_tasks(values: Sequence[str]) -> list[HarnessTask]:
    """Every ``--tasks`` entry checked (exists, runs offline when the Hub is off) before a model loads."""
    names = split_tasks(values)
    if not names:
        raise UsageError("--tasks names no task", hint=f"e.g. --tasks {BUILTIN_TASK} (or a harness task, or a task YAML file)")
    tasks, manager = [], None
    for name in names:
        if name in (BUILTIN_TASK, BUILTIN_GEN_TASK):
            tasks.append(HarnessTask(name, config=builtin_task_config(name)))
            continue
        if name.endswith((".yaml", ".yml")):
            path = Path(name).expanduser()
            if not path.is_file():
                raise UsageError(f"--tasks {name}: no such task file", hint="give the path of a harness task YAML file")
            tasks.append(HarnessTask(_yaml_task_name(path), yaml=path.absolute()))
            continue
        manager = manager or task_manager()
        if name not in manager.all_tasks:
            close = [t for t in manager.all_tasks if name.lower() in t.lower()][:5]
            raise UsageError(f"--tasks {name}: not a harness task or group",
                             hint=("did you mean " + ", ".join(close) + "?") if close else "list them: lm_eval ls tasks")
        tasks.append(HarnessTask(name))
    if offline():
        for task in tasks:
            config = task.config if task.config is not None else _harness_config(task, manager)
            wanted = _needs_download(config) if config else None
            if wanted:
                raise UsageError(f"task {task.name} downloads its data ({wanted}) and the Hub is offline "
                                 "(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE)",
                                 hint=f"run it online once (the datasets cache keeps it), or use --tasks {BUILTIN_TASK} "
                                 "or a task YAML with local data")
    return tasks


def _yaml_task_name(path: Path) -> str:
    """The ``task:`` of a harness YAML file."""
    import yaml

    try:
        data = _read_yaml(path)
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"--tasks {path}: not a readable YAML file ({exc})") from None
    name = data.get("task")
    if not isinstance(name, str) or not name:
        raise UsageError(f"--tasks {path}: the file has no 'task:' name", hint="a harness task YAML names its task")
    return name


def _harness_config(task: HarnessTask, manager) -> Optional[dict[str, Any]]:
    """The config of a named task as its YAML says (``include`` followed), without loading it (a load
    reaches for the data); a group's first subtask that would download stands for the group."""
    if task.yaml is not None:
        return None  # local by the user's own account; the harness reports a download it cannot make
    return _entry_config(manager, task.name, depth=0)


def _entry_config(manager, name: str, *, depth: int) -> Optional[dict[str, Any]]:
    entry = getattr(manager, "task_index", {}).get(name)
    if entry is None or depth > 4:
        return None
    cfg = dict(getattr(entry, "cfg", None) or {})
    members = cfg.get("task")
    if isinstance(members, list):  # a group: its members
        for member in members:
            sub = _entry_config(manager, member, depth=depth + 1) if isinstance(member, str) else None
            if sub and _needs_download(sub):
                return sub
        return None
    path = getattr(entry, "yaml_path", None)
    while "dataset_path" not in cfg and cfg.get("include") and path is not None:  # the base YAML it builds on
        path = Path(path).parent / str(cfg.pop("include"))
        cfg = {**_read_yaml(path), **cfg}
    return cfg


def _read_yaml(path: Path) -> dict[str, Any]:
    """A harness YAML file as plain data, its ``!function`` tags left unread."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 - SafeLoader subclass
    return data if isinstance(data, dict) else {}


def output_type(task: HarnessTask) -> Optional[str]:
    """The task's ``output_type`` where it can be read without loading the task (trnqwen's own, a
    task YAML file, a named harness task; the base files they include followed); None when unknown
    (a group, a type set by code)."""
    if task.config is not None:
        return task.config.get("output_type")
    if task.yaml is not None:
        cfg, path = _read_yaml(task.yaml), task.yaml
    else:
        manager = task_manager()
        entry = getattr(manager, "task_index", {}).get(task.name)
        cfg, path = dict(getattr(entry, "cfg", None) or {}), getattr(entry, "yaml_path", None)
        if isinstance(cfg.get("task"), list):
            return None  # a group: its members decide
    while "output_type" not in cfg and cfg.get("include") and path is not None:
        path = Path(path).parent / str(cfg.pop("include"))
        try:
            cfg = {**_read_yaml(path), **cfg}
        except OSError:
            return None
    kind = cfg.get("output_type")
    return kind if isinstance(kind, str) else None


def task_manager(include: Sequence[Path] = (), *, defaults: bool = True):
    """The harness's ``TaskManager``, built once per process for the same folders (the index of the
    harness's own ~13,000 task YAML files takes seconds; checking the tasks, then scoring the base
    and the tuned model, would build it three times); ``defaults=False`` skips that index (trnqwen's
    own tasks are configs and need none)."""
    try:
        import lm_eval.tasks  # noqa: F401
    except ImportError:
        raise EnvironmentProblem("--tasks needs lm-evaluation-harness, which is not installed", hint=INSTALL_HINT) from None
    return _task_manager(tuple(sorted({str(p) for p in include})), defaults)


@functools.lru_cache(maxsize=4)
def _task_manager(paths: tuple[str, ...], defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths) or None, include_defaults=defaults)


def parse_fail_below(values: Sequence[str], tasks: Sequence[str]) -> dict[str, float]:
    """``["gsm8k=-0.02"]`` -> ``{"gsm8k": -0.02}``; the task must be one of ``--tasks``."""
    gates: dict[str, float] = {}
    for value in values:
        task, sep, number = value.partition("=")
        try:
            delta = float(number)
        except ValueError:
            delta = math.nan
        if not sep or not task.strip() or not math.isfinite(delta):
            raise UsageError(f"--fail-below {value!r}: expected TASK=DELTA", hint="e.g. --fail-below trnqwen_calculator=-0.02")
        if task.strip() not in tasks:
            raise UsageError(f"--fail-below {value}: {task.strip()} is not one of --tasks ({', '.join(tasks)})")
        gates[task.strip()] = delta
    return gates


# --- scoring ---------------------------------------------------------------------------------------


def task_scores(results: dict[str, dict[str, Any]], names: Sequence[str], samples: dict[str, Any]) -> dict[str, TaskScore]:
    """The first metric of each asked-for task in ``simple_evaluate``'s ``results`` (``"acc,none"``,
    ``"exact_match,strict-match"``) with its standard error."""
    scores = {}
    for name in names:
        entry = results.get(name)
        if not entry:
            continue
        key = next((k for k, v in entry.items() if "," in k and "_stderr," not in k and isinstance(v, (int, float))), None)
        if key is None:
            continue
        metric, _, filt = key.partition(",")
        stderr = entry.get(f"{metric}_stderr,{filt}")
        count = samples.get(name)
        scores[name] = TaskScore(
            task=name, metric=metric if filt == "none" else key, value=float(entry[key]),
            stderr=float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(stderr) else None,
            samples=int(count["effective"]) if isinstance(count, dict) and "effective" in count else None,
        )
    return scores


def task_answers(samples: dict[str, list[dict[str, Any]]], names: Sequence[str]) -> dict[str, list[str]]:
    """Each generative task's answers (the harness's responses after its first filter) in document
    order; none for a log-likelihood task (its responses are numbers per choice)."""
    out = {}
    for name in names:
        rows = samples.get(name) or []
        first_filter = rows[0].get("filter") if rows else None
        rows = sorted((r for r in rows if r.get("filter") == first_filter), key=lambda r: r.get("doc_id", 0))
        texts = [r.get("filtered_resps") for r in rows]
        if texts and all(isinstance(t, list) and len(t) == 1 and isinstance(t[0], str) for t in texts):
            out[name] = [t[0] for t in texts]
    return out


def simple_evaluate(lm, tasks: Sequence[HarnessTask], *, limit: Optional[float], chat_template: bool,
                    answers: bool = False, seed: int = 1234) -> tuple[dict[str, TaskScore], dict[str, list[str]]]:
    """``lm`` (the harness's own model object: in-process ``HFLM`` or an endpoint's) through the
    harness's ``simple_evaluate``: the scores, and with ``answers`` the generative tasks' answers."""
    import logging

    import lm_eval

    from trnqwen.evaluate.stderr_filter import without_git_noise

    # its notes on being handed a loaded model (what trnqwen does on purpose) are not the user's business
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    # the harness's own task index only when a task is named or given as a file (it may name others)
    manager = task_manager([t.yaml.parent for t in tasks if t.yaml is not None],
                           defaults=any(t.config is None for t in tasks))
    with without_git_noise():
        out = lm_eval.simple_evaluate(
            model=lm, tasks=[t.config if t.config is not None else t.name for t in tasks], limit=limit,
            apply_chat_template=chat_template, task_manager=manager, log_samples=answers, bootstrap_iters=1000,
            random_seed=0, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed, verbosity="ERROR",
        )
    if not out:
        raise CheckFailed("the harness returned no results")
    names = [t.name for t in tasks]
    return (task_scores(out.get("results", {}), names, out.get("n-samples", {})),
            task_answers(out.get("samples") or {}, names) if answers else {})


def evaluate_model(model, tokenizer, tasks: Sequence[HarnessTask], *, limit: Optional[float], batch_size: int,
                   device: str, chat_template: bool, answers: bool = False,
                   seed: int = 1234) -> tuple[dict[str, TaskScore], dict[str, list[str]]]:
    """One loaded model through the harness's own ``HFLM`` wrapper and ``simple_evaluate``."""
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
    return simple_evaluate(lm, tasks, limit=limit, chat_template=chat_template, answers=answers, seed=seed)


def evaluate_endpoint(endpoint: Endpoint, target: EvalTarget, tasks: Sequence[HarnessTask], *, limit: Optional[float],
                      chat_template: bool, answers: bool = False, trust_remote_code: bool = False,
                      seed: int = 1234) -> tuple[dict[str, TaskScore], dict[str, list[str]]]:
    """One served model through the harness's own ``local-chat-completions`` model (:mod:`.endpoint`)."""
    from trnqwen.evaluate.endpoint import chat_model, loglikelihood_refused

    lm = chat_model(endpoint, target.tokenizer_dir, trust_remote_code=trust_remote_code)
    try:
        return simple_evaluate(lm, tasks, limit=limit, chat_template=chat_template, answers=answers, seed=seed)
    except NotImplementedError as exc:
        raise loglikelihood_refused(exc, endpoint.url) from None


def run_harness(targets: Sequence[EvalTarget], tasks: Sequence[HarnessTask], *, device_type: str,
                batch_size: int, limit: Optional[float], trust_remote_code: bool = False,
                endpoints: Optional[dict[str, Endpoint]] = None, answers: bool = False, say=None) -> HarnessReport:
    """Each model in turn: load (as ``trnqwen eval`` does), score every task, free; a target with an
    endpoint (by label) is scored through it instead."""
    from transformers import AutoTokenizer

    from trnqwen.evaluate import model as m

    endpoints = endpoints or {}
    tokenizer = AutoTokenizer.from_pretrained(str(targets[0].tokenizer_dir), trust_remote_code=trust_remote_code)
    report = HarnessReport(tasks=[t.name for t in tasks], limit=limit, chat_template=bool(getattr(tokenizer, "chat_template", None)))
    for target in targets:
        started = time.perf_counter()
        endpoint = endpoints.get(target.label)
        if endpoint is not None:
            scores, texts = evaluate_endpoint(endpoint, target, tasks, limit=limit, chat_template=report.chat_template,
                                              answers=answers, trust_remote_code=trust_remote_code)
        else:
            model = m.load_model(target, device_type, trust_remote_code=trust_remote_code)
            scores, texts = evaluate_model(model, tokenizer, tasks, limit=limit, batch_size=batch_size,
                                           device="cpu" if device_type == "cpu" else device_type,
                                           chat_template=report.chat_template, answers=answers)
            del model
            m.release_memory()
        result = HarnessResult(target.label, target.is_base, scores, round(time.perf_counter() - started, 1),
                               endpoint=endpoint.url if endpoint is not None else None, answers=texts)
        report.results.append(result)
        if say is not None:
            say(f"{target.label}" + (f" via {endpoint.url}" if endpoint is not None else "") + ": "
                + ", ".join(f"{s.task} {s.metric} {s.value:.4f}" for s in scores.values())
                + f" ({result.seconds:.1f}s)")
    return report


def gate_failures(report: HarnessReport, gates: dict[str, float]) -> list[str]:
    """``--fail-below`` breaches: the tuned models' drops against the base beyond each task's allowance."""
    failures = []
    for result in report.results:
        for task, delta in report.deltas(result).items():
            if task in gates and delta < gates[task]:
                failures.append(f"{result.label} {task} {delta:+.4f} vs base (allowed {gates[task]:+.4f})")
    return failures


def record(run: RunInfo, report: HarnessReport, *, folder: Optional[Path]) -> Path:
    """``<run dir>/eval-harness.json`` (atomic), beside the run's own eval.json and never over it; the
    export's model card (when trnqwen wrote it) gains the benchmark table, its held-out table kept."""
    from trnqwen.evaluate.run import rewrite_card
    from trnqwen.fsutil import write_json_atomic

    path = Path(run.run_dir) / HARNESS_RECORD
    write_json_atomic(path, {**report.to_json(answers=False), "step": run.record.steps, "evaluated_at": time.time()})
    if folder is not None:
        rewrite_card(run, folder)
    return path


def render(report: HarnessReport) -> None:
    """The table: one row per task, a column per model (score ± stderr) and the difference."""
    from rich.table import Table

    from trnqwen import output

    table = Table(title=f"lm-evaluation-harness ({'chat template' if report.chat_template else 'plain prompts'}"
                  + (f", limit {report.limit:g}" if report.limit else "") + ")")
    table.add_column("task")
    table.add_column("metric")
    for result in report.results:
        table.add_column(result.label + (" (base)" if result.is_base else "")
                         + (f" via {result.endpoint}" if result.endpoint else ""), justify="right")
    if report.base is not None:
        table.add_column("delta", justify="right")
    for task in report.tasks:
        first = next((r.scores[task] for r in report.results if task in r.scores), None)
        if first is None:
            continue
        cells = []
        for result in report.results:
            s = result.scores.get(task)
            cells.append("-" if s is None else f"{s.value:.4f}" + (f" ± {s.stderr:.4f}" if s.stderr is not None else ""))
        if report.base is not None:
            deltas = [report.deltas(r).get(task) for r in report.results if not r.is_base]
            cells.append(", ".join(f"{d:+.4f}" for d in deltas if d is not None) or "-")
        table.add_row(task, first.metric, *cells)
    output.console(stderr=False).print(table)


def run_tasks(
    checkpoints: Sequence[str],
    *,
    tasks: Sequence[str],
    run_flags: dict[str, Any],
    config_file: Optional[Path] = None,
    base: Optional[bool] = None,
    base_dir: Optional[Path] = None,
    limit: Optional[float] = None,
    fail_below: Sequence[str] = (),
    batch_size: int = 4,
    json_out: bool = False,
    endpoint: Optional[str] = None,
    base_endpoint: Optional[str] = None,
) -> HarnessReport:
    """The whole ``eval --tasks``: config -> models and tasks checked -> each model scored (loaded here,
    or through ``endpoint``/``base_endpoint``) -> table or JSON -> record -> the ``--fail-below`` gate
    (exit 1 after the results are out)."""
    import sys

    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.evaluate.run import plan_targets

    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1 (got {batch_size})")
    if limit is not None and not limit > 0:
        raise UsageError(f"--limit must be > 0 (got {limit:g})", hint="a count of samples per task, or a fraction below 1")
    resolved = resolve_config(run_flags, config_file=config_file, uses={"runs_dir", "device", "trust_remote_code"})
    for w in resolved.warnings:
        output.warn(w)
    cfg = resolved.config
    names = split_tasks(tasks)
    gates = parse_fail_below(fail_below, names)
    if base_endpoint is not None and endpoint is None:
        raise UsageError("--base-endpoint goes with --endpoint (the tuned model's server)",
                         hint="pass --endpoint URL too; only what is given is scored through a server")
    endpoints: dict[str, Endpoint] = {}
    if endpoint is not None:
        from trnqwen.evaluate import endpoint as ep

        if gates and base_endpoint is None:
            raise UsageError("--fail-below compares with the base model, and no --base-endpoint scores it",
                             hint="serve the base too and pass --base-endpoint URL")
        resolved_tasks = resolve_tasks(names)
        ep.require_generative([(t.name, output_type(t)) for t in resolved_tasks], "--endpoint")
        targets, endpoints = ep.plan(checkpoints, runs_dir=Path(cfg.runs_dir), base=base, base_dir=base_dir,
                                     endpoint=endpoint, base_endpoint=base_endpoint,
                                     trust_remote_code=cfg.trust_remote_code)
    else:
        targets = plan_targets(checkpoints, runs_dir=Path(cfg.runs_dir), base=base, base_dir=base_dir)
        if gates and not any(t.is_base for t in targets):
            raise UsageError("--fail-below compares with the base model, and there is none here",
                             hint="name it with --base-dir DIR (or evaluate a run, whose base is known)")
        resolved_tasks = resolve_tasks(names)
    say = None if json_out or not sys.stderr.isatty() else output.info
    report, failures = score_and_record(targets, resolved_tasks, gates, device=cfg.device, limit=limit,
                                        batch_size=batch_size, trust_remote_code=cfg.trust_remote_code,
                                        endpoints=endpoints, answers=json_out, say=say)
    if json_out:
        output.print_json({**report.to_json(), "ok": not failures, "gate_failures": failures})
    else:
        render(report)
    if failures:
        raise CheckFailed("--fail-below: " + "; ".join(failures),
                          hint="the fine-tune lost more than allowed on these tasks against its base")
    return report


def check_request(tasks: Sequence[str], fail_below: Sequence[str]) -> tuple[list[HarnessTask], dict[str, float]]:
    """``train --eval-tasks``: the tasks and gates checked before the run starts (a typo costs no training)."""
    resolved = resolve_tasks(tasks)
    return resolved, parse_fail_below(fail_below, [t.name for t in resolved])


def benchmark_run(run_dir: Path, tasks: Sequence[HarnessTask], gates: dict[str, float], *, device: str,
                  trust_remote_code: bool = False, batch_size: int = 4, say=None) -> tuple[HarnessReport, list[str]]:
    """A finished run's export and its base through the harness (``train --eval-tasks``), as
    ``trnqwen eval RUN --tasks`` does it; returns the report and the gate's breaches."""
    from trnqwen.evaluate.run import plan_targets

    targets = plan_targets([str(run_dir)], runs_dir=Path(run_dir).parent, base=None, base_dir=None)
    return score_and_record(targets, tasks, gates, device=device, limit=None, batch_size=batch_size,
                            trust_remote_code=trust_remote_code, say=say)


def score_and_record(targets: Sequence[EvalTarget], tasks: Sequence[HarnessTask], gates: dict[str, float], *,
                     device: str, limit: Optional[float], batch_size: int, trust_remote_code: bool,
                     endpoints: Optional[dict[str, Endpoint]] = None, answers: bool = False,
                     say=None) -> tuple[HarnessReport, list[str]]:
    """Every target scored, the report recorded in the tuned run (a read-only run dir: a warning,
    the results still returned), and the gate's breaches."""
    from trnqwen import output
    from trnqwen.evaluate.run import detect_device_type

    device_type = "cpu" if endpoints and all(t.label in endpoints for t in targets) else detect_device_type(device)
    report = run_harness(targets, tasks, device_type=device_type, batch_size=batch_size, limit=limit,
                         trust_remote_code=trust_remote_code, endpoints=endpoints, answers=answers, say=say)
    tuned = next((t for t in targets if not t.is_base and t.run is not None), None)
    if tuned is not None:
        try:
            saved = record(tuned.run, report, folder=tuned.export)
            if say is not None:
                say(f"results saved to {saved}")
        except OSError as exc:
            output.warn(f"could not record the results in {tuned.run.run_dir}: {exc.strerror or exc}")
    return report, gate_failures(report, gates)
