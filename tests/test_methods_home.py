"""A training method is a folder: outside ``trnqwen/methods/`` (and the generated help text) no
trnqwen module names a method (``dpo``/``DPO``, ``orpo``/``ORPO``).

What the commands show of a method comes from its declaration: ``trnqwen train --help`` and
``trnqwen data --help`` list each method's :class:`~trnqwen.methods.base.Example` lines, and the data
pipeline's hints name the methods its caller hands it (``DataSettings.pair_methods``, asked of the
registry: ``dataset/`` sits below ``methods/``).  No module is exempt.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "trnqwen"
WORDS = re.compile(r"(?i)(?<![a-z])(dpo|orpo)")  # not "endpoint", "ThreadPoolExecutor", "corpora"
EXEMPT = ("trnqwen/methods/", "trnqwen/cli/_help_text.py")  # the methods' folders + registry; generated help


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("methods-home") / "tiny-qwen3")


def offenders() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel.startswith(EXEMPT):
            continue
        lines = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if WORDS.search(line)]
        if lines:
            found[rel] = lines
    return found


def test_no_module_outside_the_methods_names_a_method():
    found = {path: lines[:5] for path, lines in offenders().items()}
    assert not found, ("these modules name a training method outside trnqwen/methods/ (ask the registry, "
                       f"trnqwen.methods.registry, or let the method declare it): {found}")


def test_the_pattern_finds_the_words_and_not_their_lookalikes():
    hits = [w for w in ("dpo_loss", "--method dpo", "DPOTrainer", "[DPO]", "orpo", "ORPO's") if WORDS.search(w)]
    assert len(hits) == 6
    assert not any(WORDS.search(w) for w in ("rdzv_endpoint", "ThreadPoolExecutor", "cleanPodPolicy", "corpora"))


# --- what the users see still names the methods, from their declarations ------------------------


def test_the_commands_help_shows_each_methods_examples():
    from trnqwen.cli import data, train
    from trnqwen.methods import registry

    for command, epilog in (("train", train.EPILOG), ("data", data.EPILOG)):
        shown = registry.examples(command)
        assert shown, f"no method declares an example for {command}"
        for example in shown:
            assert example.line in epilog and example.what in epilog, (command, example)
    assert "--method dpo --beta 0.1 --dataset prefs.jsonl" in train.EPILOG
    assert "--method orpo --orpo-lambda 0.1" in train.EPILOG
    assert "trnqwen data prefs.jsonl --method dpo      # preference pairs" in data.EPILOG


def test_a_new_methods_example_reaches_the_help_with_no_cli_change():
    import importlib

    from trnqwen.cli import train
    from trnqwen.methods import registry
    from trnqwen.methods.base import Example, Method

    registry.register(Method(name="dummy", help="a test method", data="chat",
                             examples=(Example("train", "trnqwen train --method dummy", "the dummy method"),)))
    try:
        epilog = importlib.reload(train).EPILOG
        assert "  # the dummy method\n  trnqwen train --method dummy\n" in epilog
    finally:
        registry.unregister("dummy")
        importlib.reload(train)


def test_the_data_hints_name_the_methods_the_caller_hands_in(tiny, tmp_path):
    from trnqwen.config import RunConfig
    from trnqwen.dataset.prepare import DataSettings, _check_settings, pair_method_flags, prepare_dataset
    from trnqwen.errors import UsageError
    from trnqwen.methods import registry

    names = registry.names_for_data("preference")
    assert {"dpo", "orpo"} <= set(names) and "sft" not in names
    assert pair_method_flags(("a",)) == "--method a"
    assert pair_method_flags(("a", "b", "c")) == "--method a, --method b or --method c"
    assert "pair_methods" not in DataSettings(pair_methods=names).key_fields()  # hints only: caches keep their keys
    with pytest.raises(UsageError) as err:
        _check_settings(DataSettings(dataset_format="prompt-chosen-rejected", pair_methods=names))
    assert "--method dpo" in err.value.hint and "--method orpo" in err.value.hint
    # the whole pipeline, handed the names as the CLI and the launcher hand them
    data = tmp_path / "prefs.jsonl"
    data.write_text('{"prompt": "Q?", "chosen": "A.", "rejected": "B."}\n')
    cfg = RunConfig(dataset=str(data), seq_len=128)
    with pytest.raises(UsageError) as err:
        prepare_dataset(cfg, tiny, cache_root=tmp_path / "cache", pair_methods=names)
    assert "this run is supervised (--method sft)" in err.value.message
    assert err.value.hint.startswith("train on pairs with --method dpo") and "--method orpo" in err.value.hint
