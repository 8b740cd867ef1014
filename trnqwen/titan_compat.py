"""Every difference between torchtitan versions, in one place.

Three API shapes are known (``benchmarks/torchtitan_releases.py`` checks them against the
releases on the package index; docs/versions.md records what each release supports):

``0.2-toml`` the published 0.2.0, 0.2.1 and 0.2.2 releases: TOML job configs launched with
            ``--job.config_file``, no ``torchtitan.config.override`` registry, no
            ``--module/--config`` launcher, no ``model_registry``.  trnqwen's generated config
            module and its overrides cannot run there: detected and refused with a clear message.

``recipe``  the mid-2026 torchtitan main branch the published Trainium recipe was written against
            (between 0.2.2 and 0.3.0; no release on the index has this shape):
            ``model_registry(flavor, attn_backend="sdpa")``, ``@override("name", target=...)``,
            ``--override.imports my_module`` (a module), log lines
            ``[Override] nki_rope: <fqn> <Src> -> <Dst>``.
``0.3``     torchtitan 0.3.0 (the public index's latest): SDPA is refused for language models
            (``flex``), ``@override(target=...)`` has no name (the override is named by its
            factory's ``module.function`` path), ``--override.imports module.function`` (one or
            more), log lines ``[Override] module.function: <fqn> <Src> -> <Dst>`` then
            ``Applied N override(s)``; the Transformers backend runs only under
            ``spmd_backend='spmd_types'``; trnqwen's ranks extend its Configurable classes through
            the config (:data:`EXTENDED_03`).

:func:`detect` reads the installed version with importlib.metadata and probes two source files
as text (no torch import), once per process.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

ERA_TOML = "0.2-toml"
ERA_RECIPE = "recipe"
ERA_03 = "0.3"


@dataclass(frozen=True)
class TitanAPI:
    """What the installed torchtitan expects; recipes and the rank entry consult only this."""

    era: str
    version: Optional[str] = None
    # Attention backend name for native language models.
    attn_backend: str = "flex"
    # @override(...) takes the override's name as first positional argument.
    override_takes_name: bool = False
    # --override.imports entries name a module ("module") or a factory ("function").
    override_import_style: str = "function"
    # SPMD backend: the HF backend requires spmd_types; native on CPU ran with partial_dtensor.
    hf_spmd_backend: Optional[str] = "spmd_types"
    native_cpu_spmd_backend: Optional[str] = "partial_dtensor"
    # Config entry points.
    qwen3_package: str = "torchtitan.models.qwen3"
    qwen3_config_registry: str = "torchtitan.models.qwen3.config_registry"
    native_base_fn: str = "qwen3_32b"
    hf_config_registry: str = "torchtitan.experiments.transformers_modeling_backend.config_registry"
    hf_base_fn: str = "transformers_modeling_backend_full"
    trainer_module: str = "torchtitan.train"
    # Data: chat-format fine-tuning loader exists; c4_test ships inside the package.
    has_chat_dataloader: bool = True
    c4_test_in_package: bool = False
    # torchtitan.config.override's registry and the --module/--config launcher exist (trnqwen's
    # generated config module needs both; the 0.2.x releases have neither).
    has_override_registry: bool = True
    launcher: str = "module_config"  # or "job_config_file" (--job.config_file TOML, 0.2.x)

    @property
    def supported(self) -> bool:
        return self.has_override_registry and self.launcher == "module_config"

    @property
    def native_flavor_table(self) -> str:
        """``<module>:<name>`` of the dict mapping Qwen3 flavor names to model-config builders."""
        return f"{self.qwen3_package}:qwen3_configs"


RECIPE_API = TitanAPI(
    era=ERA_RECIPE,
    attn_backend="sdpa",
    override_takes_name=True,
    override_import_style="module",
    hf_spmd_backend=None,
    native_cpu_spmd_backend="partial_dtensor",
    has_chat_dataloader=False,
)
API_03 = TitanAPI(era=ERA_03)
TOML_API = TitanAPI(
    era=ERA_TOML,
    attn_backend="sdpa",
    override_takes_name=False,
    override_import_style="module",
    hf_spmd_backend=None,
    native_cpu_spmd_backend=None,
    has_chat_dataloader=False,
    has_override_registry=False,
    launcher="job_config_file",
)

# What trnqwen's ranks extend through torchtitan 0.3.0's config (trnqwen.runtime.trainer*): the
# Configurable trainer config (``Trainer.Config`` with ``checkpoint``/``metrics``/``validator``
# sub-configs, ``config.build()``) and these methods of its classes, overridden in subclasses.
# A torchtitan that renames one would silently skip trnqwen's override: tests/test_compat.py checks
# each is still there (and has the parameters the override passes on).
EXTENDED_03: dict[str, tuple[str, ...]] = {
    "torchtitan.trainer:Trainer": ("__init__", "post_dataloading_process", "batch_generator",
                                   "should_continue_training"),
    "torchtitan.components.checkpointer.dcp:CheckpointManager": (
        "__init__", "load", "_load", "save", "_save_last_step", "dcp_load", "dcp_save", "_find_load_step",
        "_create_checkpoint_id", "_flattened_model_states_sd", "_purge_stale_checkpoints",
    ),
    "torchtitan.components.metrics:MetricsProcessor": ("__init__", "log", "log_validation", "close"),
    "torchtitan.components.validate:Validator": ("__init__", "post_dataloading_process"),
    "torchtitan.models.common.moe:GroupedExperts": ("_grouped_mm",),
}


def installed_version() -> Optional[str]:
    from trnqwen.env.versions import package_versions

    return package_versions(("torchtitan",))["torchtitan"]


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+\-]", text):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def _package_dir() -> Optional[Path]:
    spec = importlib.util.find_spec("torchtitan")  # torchtitan/__init__ is import-light
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def probe_sources(package_dir: Optional[Path]) -> dict[str, Any]:
    """Feature facts read from source text; empty when the files are not there."""
    facts: dict[str, Any] = {}
    if package_dir is None:
        return facts
    override_py = package_dir / "config" / "override.py"
    manager_py = package_dir / "config" / "manager.py"
    if manager_py.is_file():
        text = manager_py.read_text(errors="replace")
        if "--module" in text:
            facts["launcher"] = "module_config"
        elif "--job.config_file" in text or "--job.config-file" in text:
            facts["launcher"] = "job_config_file"
        facts["has_override_registry"] = override_py.is_file()
    if override_py.is_file():
        text = override_py.read_text(errors="replace")
        match = re.search(r"def override\(\s*([^)]*?)\)", text, re.S)
        if match:
            first = match.group(1).strip().split(",")[0].strip()
            facts["override_takes_name"] = first not in ("*", "") and not first.startswith("*")
    attn_cfg = package_dir / "models" / "common" / "config_utils.py"
    if attn_cfg.is_file():
        facts["sdpa_refused"] = "sdpa is no longer supported" in attn_cfg.read_text(errors="replace")
    datasets_py = package_dir / "hf_datasets" / "text_datasets.py"
    if datasets_py.is_file():
        facts["has_chat_dataloader"] = "class ChatDataLoader" in datasets_py.read_text(errors="replace")
    facts["c4_test_in_package"] = (package_dir.parent / "tests" / "assets" / "c4_test").is_dir() or (
        package_dir / "tests" / "assets" / "c4_test"
    ).is_dir()
    return facts


def api_for(version: Optional[str], facts: Optional[dict[str, bool]] = None) -> TitanAPI:
    """The API shape for a version string, refined by source-probe facts when given."""
    facts = facts or {}
    if facts.get("launcher") == "job_config_file" or facts.get("has_override_registry") is False:
        base = TOML_API
    elif "override_takes_name" in facts or "sdpa_refused" in facts:
        recipe_like = facts.get("override_takes_name", False) or not facts.get("sdpa_refused", True)
        base = RECIPE_API if recipe_like else API_03
    elif version is not None and _version_tuple(version) < (0, 3) and re.fullmatch(r"\d+(\.\d+)*", version):
        base = TOML_API  # a plain 0.2.x release (no source to read): the index's 0.2.x are all TOML-era
    else:
        # unknown, or a dev/git build before 0.3 (the recipe era was the main branch)
        base = RECIPE_API if version is None or _version_tuple(version) < (0, 3) else API_03
    api = replace(base, version=version)
    if "has_chat_dataloader" in facts:
        api = replace(api, has_chat_dataloader=facts["has_chat_dataloader"])
    if "c4_test_in_package" in facts:
        api = replace(api, c4_test_in_package=facts["c4_test_in_package"])
    return api


@functools.lru_cache(maxsize=1)
def detect() -> TitanAPI:
    """The installed torchtitan's API shape (cached; imports nothing heavy)."""
    version = installed_version()
    return api_for(version, probe_sources(_package_dir()) if version else None)


def require_torchtitan() -> TitanAPI:
    from trnqwen.errors import EnvironmentProblem

    api = detect()
    if api.version is None:
        raise EnvironmentProblem(
            "torchtitan is not installed",
            hint="install the training extras: pip install 'trnqwen[train]' (keeps your torch build)",
        )
    if not api.supported:
        raise EnvironmentProblem(
            f"torchtitan {api.version} takes TOML job configs (--job.config_file) and has no override registry; "
            "trnqwen's config module needs --module/--config and torchtitan.config.override",
            hint="install torchtitan 0.3.0 or later: pip install 'torchtitan>=0.3.0' --no-deps (see docs/versions.md)",
        )
    return api


# --- override imports ------------------------------------------------------------------------


def format_override_imports(targets: list[str], api: Optional[TitanAPI] = None) -> list[str]:
    """``--override.imports`` argv tokens in the installed syntax (empty list when none)."""
    api = api or detect()
    targets = [t for t in targets if t]
    if not targets:
        return []
    if api.override_import_style == "module":
        modules: list[str] = []
        for target in targets:
            module = module_of_target(target)
            if module not in modules:
                modules.append(module)
        return ["--override.imports", ",".join(modules)]
    return ["--override.imports", *targets]


def module_of_target(target: str) -> str:
    """``pkg.mod.factory`` -> ``pkg.mod`` when the last part looks like a factory, else as is."""
    target = target.split("=", 1)[0]
    module, _, last = target.rpartition(".")
    if module and last and _module_exists(module) and not _module_exists(target):
        return module
    return target


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def expand_override_imports(entries: list[Any], registry: dict[str, Any]) -> list[Any]:
    """0.3 wants ``module.function``; expand a bare module (recipe syntax) to its overrides.

    Runs inside ranks, after importing each bare module so its ``@override`` decorators have
    registered in ``registry`` (torchtitan's ``_REGISTRY``).
    """
    import importlib

    out: list[Any] = []
    for entry in entries:
        target = entry if isinstance(entry, str) else entry[0]
        if target in registry or not _module_exists(target):
            out.append(entry)
            continue
        importlib.import_module(target)
        names = [key for key, ov in registry.items() if getattr(ov, "origin_module", None) == target]
        if not names:
            out.append(entry)
        for name in names:
            out.append(name if isinstance(entry, str) else (name, entry[1]))
    return out


def register_override(
    factory: Callable,
    *,
    name: str,
    target: type,
    description: str = "",
    exact: bool = False,
    fqns: Optional[list[str]] = None,
    api: Optional[TitanAPI] = None,
) -> Callable:
    """Apply torchtitan's ``@override`` with the installed signature (name argument or not)."""
    from torchtitan.config import override

    api = api or detect()
    kwargs: dict[str, Any] = {"target": target, "description": description, "exact": exact}
    if fqns is not None:
        kwargs["fqns"] = fqns
    decorator = override(name, **kwargs) if api.override_takes_name else override(**kwargs)
    return decorator(factory)


def override_name(module: str, function: str, api: Optional[TitanAPI] = None) -> str:
    """How an override shows up in logs and imports: its registered name or ``module.function``."""
    api = api or detect()
    return function if api.override_takes_name else f"{module}.{function}"


# --- SPMD backend ----------------------------------------------------------------------------


def spmd_backend(backend: str, device: str, api: Optional[TitanAPI] = None) -> Optional[str]:
    """The ``parallelism.spmd_backend`` to set, or None to keep the base config's."""
    api = api or detect()
    if backend == "hf-v5":
        return api.hf_spmd_backend
    if device == "cpu":
        return api.native_cpu_spmd_backend
    return None


# --- model flavors ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FlavorDims:
    """The shape facts of a Qwen3 model config, comparable with an HF config.json."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    ffn_dim: Optional[int]  # dense FFN hidden size; for MoE only when some layers are dense
    tied: bool
    rope_theta: float
    num_experts: Optional[int] = None
    top_k: Optional[int] = None
    moe_ffn_dim: Optional[int] = None
    route_norm: Optional[bool] = None  # MoE: top-k weights renormalised (HF norm_topk_prob)
    dense_layers: tuple[int, ...] = ()  # MoE: the layers with a dense MLP (mlp_only_layers, sparse step)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))  # JSON cache: lists

    @property
    def shape_key(self) -> tuple:
        return (
            self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim, self.vocab_size,
            self.ffn_dim, self.tied, self.num_experts, self.top_k, self.moe_ffn_dim, self.route_norm,
            self.dense_layers,
        )

    @property
    def moe_layers(self) -> int:
        """How many layers are routed experts (0 for a dense model)."""
        return self.n_layers - len(self.dense_layers) if self.num_experts else 0


def dims_from_model_config(model_cfg: Any) -> FlavorDims:
    """Read FlavorDims off a torchtitan Qwen3Model.Config (0.3 layout)."""
    layers = model_cfg.layers
    attn = layers[0].attention
    moe_layer = next((layer for layer in layers if getattr(layer, "moe", None) is not None), None)
    dense_layer = next((layer for layer in layers if getattr(layer, "moe", None) is None), None)
    ffn = getattr(dense_layer, "feed_forward", None) if dense_layer is not None else None
    num_experts = top_k = moe_ffn = route_norm = None
    dense_layers: tuple[int, ...] = ()
    if moe_layer is not None:
        moe = moe_layer.moe
        num_experts = moe.num_experts
        top_k = moe.router.top_k
        moe_ffn = moe.routed_experts.inner_experts.hidden_dim
        route_norm = bool(moe.router.route_norm)
        dense_layers = tuple(i for i, layer in enumerate(layers) if getattr(layer, "moe", None) is None)
    return FlavorDims(
        dim=model_cfg.dim,
        n_layers=len(layers),
        n_heads=attn.n_heads,
        n_kv_heads=attn.n_kv_heads or attn.n_heads,
        head_dim=attn.head_dim,
        vocab_size=model_cfg.vocab_size,
        ffn_dim=ffn.w1.out_features if ffn is not None else None,
        tied=bool(getattr(model_cfg, "enable_weight_tying", False)),
        rope_theta=float(attn.rope.theta),
        num_experts=num_experts,
        top_k=top_k,
        moe_ffn_dim=moe_ffn,
        route_norm=route_norm,
        dense_layers=dense_layers,
    )


def dims_from_hf_config(config: dict[str, Any]) -> FlavorDims:
    """FlavorDims from a Qwen3 / Qwen3-MoE ``config.json`` dict (every MoE key form: the one
    reader is :func:`trnqwen.assets.moe_layout`)."""
    from trnqwen.assets import moe_layout

    rope_theta = config.get("rope_theta")
    if rope_theta is None:
        rope_theta = (config.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
    layout = moe_layout(config)
    moe = layout if layout is not None and layout.is_moe else None
    heads = int(config["num_attention_heads"])
    dense_layers = moe.dense_layers if moe else ()
    return FlavorDims(
        dim=int(config["hidden_size"]),
        n_layers=int(config["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        vocab_size=int(config["vocab_size"]),
        ffn_dim=(moe.dense_ffn_dim if dense_layers else None) if moe else int(
            layout.dense_ffn_dim if layout is not None else config["intermediate_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        rope_theta=float(rope_theta),
        num_experts=moe.num_experts if moe else None,
        top_k=moe.top_k if moe else None,
        moe_ffn_dim=moe.moe_ffn_dim if moe else None,
        route_norm=moe.norm_topk_prob if moe else None,
        dense_layers=dense_layers,
    )


def _flavors_in_this_process() -> dict[str, FlavorDims]:
    """Read the registered Qwen3 flavors by importing torchtitan (run in a child process)."""
    import importlib

    api = require_torchtitan()
    module_name, _, attr = api.native_flavor_table.partition(":")
    table = getattr(importlib.import_module(module_name), attr)
    flavors: dict[str, FlavorDims] = {}
    for name, builder in table.items():
        if name.startswith("debugmodel"):
            continue
        try:
            flavors[name] = dims_from_model_config(builder(attn_backend=api.attn_backend))
        except (AttributeError, TypeError, KeyError, ValueError):  # unreadable flavor: not offered
            continue
    return flavors


def _flavor_cache_file() -> Optional[Path]:
    """A per-torchtitan-install cache file, so the table is read once per install, not per run."""
    origin = _package_dir()
    if origin is None:
        return None
    try:
        stamp = int((origin / "models" / "qwen3").stat().st_mtime)
    except OSError:
        stamp = 0
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trnqwen"
    version = installed_version() or "unknown"
    return base / f"qwen3-flavors-v2-{version}-{stamp}.json"  # v2: route_norm, dense_layers


@functools.lru_cache(maxsize=1)
def native_flavors() -> dict[str, FlavorDims]:
    """Registered Qwen3 flavors of the installed torchtitan with their dims.

    Building the flavor table imports torch and torchtitan.  The launcher process must stay free
    of both (a Neuron torch would load its runtime and claim NeuronCores the ranks need, and the
    import costs seconds), so the table is read in a short-lived child process and cached on disk
    per torchtitan install.
    """
    import json
    import subprocess
    import sys

    from trnqwen.errors import EnvironmentProblem

    cache = _flavor_cache_file()
    if cache is not None and cache.is_file():
        try:
            data = json.loads(cache.read_text())
            return {name: FlavorDims(**dims) for name, dims in data.items()}
        except (ValueError, TypeError):
            pass
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    code = (
        "import dataclasses, json\n"
        "from trnqwen.titan_compat import _flavors_in_this_process\n"
        "print(json.dumps({k: dataclasses.asdict(v) for k, v in _flavors_in_this_process().items()}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(
            f"could not read torchtitan's Qwen3 flavors: {last}",
            hint="check the torchtitan install with `trnqwen check-env`",
        )
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, cache)
        except OSError:
            pass
    return {name: FlavorDims(**dims) for name, dims in data.items()}


def match_flavor(hf_dims: FlavorDims, flavors: dict[str, FlavorDims]) -> Optional[str]:
    """The registered flavor whose architecture equals the checkpoint's (rope theta aside)."""
    for name, dims in flavors.items():
        if dims.shape_key == hf_dims.shape_key:
            return name
    return None
