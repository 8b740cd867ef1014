"""Several datasets mixed by weight or record count (issue 37): real files, the tiny model's tokenizer.

Each dataset keeps its own format and mapping; 3:1 weights give 75% / 25% of the trained tokens
(within 2 points), reported per source in ``trnqwen data``, the plan and run.json; the choice is
seeded and part of the cache key, so a resumed run reads the same mixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_clean_error
from tests.test_data_mapping import write_jsonl
from trnqwen.dataset.cache import open_split
from trnqwen.dataset.prepare import DataSettings, prepare
from trnqwen.errors import UsageError

SHAREGPT_MAPPING = {"field_messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"},
                    "roles": {"user": ["human"], "assistant": ["gpt"]}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("mixture") / "tiny-qwen3")


def mixed_lengths(n: int, seed: int = 0) -> list[dict]:
    """Prompt/completion records of very different lengths, words from the tiny corpus."""
    from trnqwen.fetch.builtin import corpus_documents

    words = " ".join(corpus_documents()).split()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(3, 90, size=2))
        start = int(rng.integers(0, len(words) - 200))
        out.append({"prompt": " ".join(words[start:start + a]), "completion": " ".join(words[start + a:start + a + b])})
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Two datasets in two shapes: the bundled chats as ShareGPT (own names), prompt/completion text."""
    from trnqwen.data import chat_recipe

    folder = tmp_path_factory.mktemp("sources")
    chats = [json.loads(line) for line in chat_recipe.chat_path().read_text().splitlines()]
    speakers = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = [{"conversations": [{"from": speakers[m["role"]], "value": m["content"]} for m in r["messages"]]} for r in chats]
    return {"chats": write_jsonl(folder / "chats.jsonl", sharegpt),
            "texts": write_jsonl(folder / "texts.jsonl", mixed_lengths(400))}


def entry(path: Path, **kw) -> dict:
    return {"path": str(path), **kw}


def mix(tmp_path, tiny, entries, **kw):
    return prepare(DataSettings(datasets=entries, seq_len=256, **kw), tiny, tmp_path / "cache")


def shares(report) -> list[float]:
    return [s["share"] for s in report["sources"]]


def test_weights_3_to_1_give_75_25_of_the_trained_tokens(tmp_path, tiny, sources):
    for weights in ((3, 1), (1, 3)):
        result = mix(tmp_path, tiny, [entry(sources["chats"], weight=weights[0], **SHAREGPT_MAPPING),
                                      entry(sources["texts"], weight=weights[1], type="prompt-completion")])
        report = result.report
        expected = [w / sum(weights) for w in weights]
        assert all(abs(got - want) <= 0.02 for got, want in zip(shares(report), expected)), shares(report)
        a, b = report["sources"]
        assert (a["format"], b["format"]) == ("messages", "prompt-completion") and report["format"] == "mixed: messages, prompt-completion"
        assert a["records"] == 300 and b["records"] == 400 and a["weight"] == weights[0]
        assert a["trained_tokens"] + b["trained_tokens"] == report["trained_tokens"]
        split = open_split(result.cache_dir)
        assert int((np.asarray(split.labels) != -100).sum()) == report["trained_tokens"]
        assert a["train_records"] + b["train_records"] == report["train_records"] == split.stats["documents"]
        # the largest mix without repeats: one source is taken whole, the other sampled down
        assert a["train_records"] == 300 or b["train_records"] == 400
        assert a["mapping"][0] == "messages <- column 'conversations' (field_messages)" and "mapping" not in b


def test_record_counts_sample_and_repeat(tmp_path, tiny, sources):
    result = mix(tmp_path, tiny, [entry(sources["chats"], records=50, **SHAREGPT_MAPPING),
                                  entry(sources["texts"], records=1000)])
    a, b = result.report["sources"]
    assert (a["train_records"], b["train_records"]) == (50, 1000)  # 400 texts: each 2 or 3 times
    assert a["requested_records"] == 50
    assert result.report["train_records"] == 1050 == open_split(result.cache_dir).stats["documents"]


def test_each_source_holds_out_its_own_validation(tmp_path, tiny, sources):
    result = mix(tmp_path, tiny, [entry(sources["chats"], weight=1, val_split=0.1, **SHAREGPT_MAPPING),
                                  entry(sources["texts"], weight=1)], val_split=0.05)
    report = result.report
    assert report["val_records"] == 30 + 20  # 10% of 300, --val-split's 5% of 400
    assert report["records"] == 700 and open_split(result.cache_dir, "val").stats["documents"] == 50


def test_the_mixture_is_seeded_and_in_the_cache_key(tmp_path, tiny, sources):
    entries = [entry(sources["chats"], weight=3, **SHAREGPT_MAPPING), entry(sources["texts"], weight=1)]
    first = mix(tmp_path, tiny, entries)
    again = mix(tmp_path / "other", tiny, entries)
    assert first.key == again.key and not again.reused
    for x, y in zip((first.split().input_ids, first.split().labels), (again.split().input_ids, again.split().labels)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert mix(tmp_path, tiny, entries).reused
    other_seed = mix(tmp_path, tiny, entries, seed=7)
    other_weight = mix(tmp_path, tiny, [entries[0], {**entries[1], "weight": 2}])
    assert len({first.key, other_seed.key, other_weight.key}) == 3
    # in file order (sequential packing) the rows show the choice itself: another seed picks other texts
    seq = [mix(tmp_path, tiny, entries, packing_strategy="sequential", seed=seed).split() for seed in (42, 7)]
    assert not np.array_equal(np.asarray(seq[0].input_ids[-5:]), np.asarray(seq[1].input_ids[-5:]))


def test_preference_pairs_mix_too(tmp_path, tiny):
    from trnqwen.data import preference_recipe

    own = [{"q": f"What is {i} plus 2?", "good": f"{i} plus 2 is {i + 2}.", "bad": f"{i} plus 2 is {i + 3}."} for i in range(40)]
    mine = write_jsonl(tmp_path / "own.jsonl", own)
    result = mix(tmp_path, tiny, [
        entry(preference_recipe.prefs_path(), weight=1),
        entry(mine, weight=1, field_prompt="q", field_chosen="good", field_rejected="bad"),
    ], method="dpo", data_kind="preference")
    assert all(abs(s - 0.5) <= 0.02 for s in shares(result.report)), shares(result.report)
    assert result.report["pairs"] == sum(s["train_records"] for s in result.report["sources"])


@pytest.mark.parametrize("settings,message", [
    (dict(dataset="x.jsonl"), "--dataset x.jsonl and [[datasets]] tables both name the data"),
    (dict(mapping={"field_messages": "c"}), "field_messages set for the whole run, with [[datasets]] tables"),
])
def test_conflicting_data_settings_are_refused(tmp_path, tiny, sources, settings, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        mix(tmp_path, tiny, [entry(sources["texts"], weight=1)], **settings)


@pytest.mark.parametrize("entries,message", [
    ([{"weight": 1}, {"records": 5}], "mixes weights and record counts"),
    ([{"weight": 1}, {}], "has no weight, the others do"),
    ([{"weight": 1, "val_split": "test"}, {"weight": 1}], "names a Hub split, and this is a local dataset"),
    ([{"weight": 1, "type": "sharegpt-ish"}, {"weight": 1}], "unknown type 'sharegpt-ish'"),
])
def test_inconsistent_tables_are_refused(tmp_path, tiny, sources, entries, message):
    with pytest.raises(UsageError, match=message):
        mix(tmp_path, tiny, [entry(sources["texts"], **entries[0]), entry(sources["chats"], **entries[1])])


def tables(sources: dict[str, Path], chats: str = "", texts: str = "") -> str:
    """trnqwen.toml: the chats (ShareGPT, mapped) at weight 3, the texts at weight 1, with extra lines."""
    return f"""
[[datasets]]
path = "{sources['chats']}"
weight = 3
{chats}
field_messages = "conversations"
message_property_mappings = {{ role = "from", content = "value" }}
roles = {{ user = ["human"], assistant = ["gpt"] }}

[[datasets]]
path = "{sources['texts']}"
weight = 1
{texts}
"""


def test_toml_tables_with_axolotls_keys_and_their_mistakes(tmp_path, sources):
    from trnqwen.config import resolve_config
    from trnqwen.errors import ConfigError

    toml = tmp_path / "trnqwen.toml"
    toml.write_text(tables(sources, chats='type = "chat_template"', texts='remove_columns = ["id"]'))
    cfg = resolve_config(config_file=toml, environ={}).config
    assert [e.weight for e in cfg.datasets] == [3, 1] and cfg.datasets[0].roles == {"user": ["human"], "assistant": ["gpt"]}
    toml.write_text(toml.read_text().replace("weight = 1\n", "weight = 1\nrecord = 5\n"))
    with pytest.raises(ConfigError, match=r"datasets\.1\.record"):
        resolve_config(config_file=toml, environ={})
    toml.write_text(f'[[datasets]]\npath = "{sources["texts"]}"\nweight = 1\nrecords = 4\n')
    with pytest.raises(ConfigError, match="give weight or records, not both"):
        resolve_config(config_file=toml, environ={})


def test_trnqwen_data_reports_every_source(cli, in_tmp, tiny, sources):
    (in_tmp / "trnqwen.toml").write_text(tables(sources))
    base = ["data", "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--seq-len", "256",
            "--data-cache-dir", str(in_tmp / "cache")]
    r = cli(*base)
    assert r.code == 0, r.text
    assert "2 datasets, share of the trained tokens" in r.out
    line = next(x for x in r.out.splitlines() if "chats.jsonl" in x and "%" in x)
    assert "weight 3" in line and "messages" in line
    report = json.loads(cli(*base, "--json").out)
    assert abs(report["sources"][0]["share"] - 0.75) <= 0.02
    assert_clean_error(cli(*base, str(sources["texts"])), code=2, contains="and [[datasets]] tables both name the data")


def test_a_resumed_run_reads_the_same_mixture(in_tmp, tiny, sources, cli):
    """The recorded config (run.json) resolves to the same cache; a source that changed is refused."""
    from tests.test_resume import _dcp
    from trnqwen.config import RunConfig, resolve_config
    from trnqwen.contract import checkpoint_layout as checkpoints
    from trnqwen.dataset.prepare import prepare_dataset
    from trnqwen.rundir import RunRecord, point_last

    texts = write_jsonl(in_tmp / "texts.jsonl", mixed_lengths(120))
    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny, backend="native", device="cpu", nproc_per_node=1,
                    steps=8, seq_len=256, finetune=True,
                    datasets=[entry(sources["chats"], weight=3, **SHAREGPT_MAPPING), entry(texts, weight=1)])
    root = in_tmp / cfg.resolved_checkpoint_dir
    runs = in_tmp / ".trnqwen" / "runs"
    config = json.loads(json.dumps(cfg.model_dump(mode="json")))
    cache_dir = prepare_dataset(resolve_config(config, environ={}).config).cache_dir
    record = RunRecord(run_id="r1", run_dir=str(runs / "r1"), status="interrupted", config=config,
                       checkpoint_dir=str(root), assets_dir=str(tiny), backend="native", steps=8,
                       extra={"cwd": str(in_tmp), "interrupted_at_step": 4, "dataset_cache": str(cache_dir)})
    (runs / "r1").mkdir(parents=True)
    record.save()
    point_last(runs, "r1")
    _dcp(root / "resume" / "step-4")
    checkpoints.write_owner(root, run_id="r1", model="builtin:tiny-qwen3", backend="native")
    dry = cli("train", "--resume", "--dry-run", "--json")
    assert dry.code in (0, 1), dry.text
    plan = json.loads(dry.out)
    assert plan["config"]["datasets"][0]["weight"] == 3
    assert str(cache_dir) in plan["config_module_text"]  # the ranks read the same cache: the same rows
    assert any("mixture, share of the trained tokens" in note for note in plan["notes"])
    texts.write_text(texts.read_text() + json.dumps(mixed_lengths(1, seed=9)[0]) + "\n")
    assert_clean_error(cli("train", "--resume"), code=2, contains="the training data of run r1 changed since it was saved")


def test_text_and_conversations_are_not_mixed(tmp_path, tiny, sources, cli, in_tmp):
    """Text records train every token, conversations only the answers: one run does not mix them.
    Detected, the mixture stops after the dataset that breaks it is read (nothing tokenized);
    declared (type = "text"), before any record is read: the broken line of the chats is never reached."""
    texts = tmp_path / "notes.txt"
    texts.write_text("First document about units.\n\nSecond document about hours and minutes.\n")
    message = "the datasets mix text records"
    with pytest.raises(UsageError, match=message) as caught:
        mix(tmp_path, tiny, [entry(sources["chats"], weight=1, **SHAREGPT_MAPPING), entry(texts, weight=1)])
    assert "notes.txt: every token trained" in str(caught.value) and "chats.jsonl, messages" in str(caught.value)
    assert "prompt/completion" in caught.value.hint
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": [}\n')
    with pytest.raises(UsageError, match=message):
        mix(tmp_path, tiny, [entry(texts, weight=1, type="text"), entry(broken, weight=1, type="messages")])
    (in_tmp / "trnqwen.toml").write_text(f'[[datasets]]\npath = "{texts}"\nweight = 1\n\n'
                                         f'[[datasets]]\npath = "{sources["texts"]}"\nweight = 3\n')
    r = cli("data", "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--seq-len", "256",
            "--data-cache-dir", str(in_tmp / "cache"))
    assert_clean_error(r, code=2, contains=message)
    assert [line for line in r.text.splitlines() if line.startswith("Error:")] == [r.text.splitlines()[0]]
    assert not (in_tmp / "cache").exists() or not any((in_tmp / "cache").iterdir())
