"""GRPO's rewards: ``--reward`` values, the built-ins (against TRL's own reward functions where TRL
has one), a TRL-style function of yours from a module file, TRL's functions run unchanged, the
weighted sum with None, and the errors that stop a run naming the function and the record.
"""

from __future__ import annotations

import math
import textwrap

import pytest

from trnqwen.errors import UsageError
from trnqwen.methods.grpo.rewards import (
    BuiltinOptions,
    RewardError,
    RewardSet,
    as_completions,
    parse_rewards,
)

torch = pytest.importorskip("torch")



def _score(values, completions, *, columns=None, options=BuiltinOptions(), ids=None, conversational=True):
    rs = RewardSet.build(parse_rewards(values), options)
    n = len(completions)
    records = [f"prompts.jsonl line {i}" for i in range(1, n + 1)]
    return rs.score(["q"] * n, as_completions(completions, conversational), ids or [[1, 2]] * n, columns or {}, records)


def test_parse_names_weights_and_targets():
    specs = parse_rewards(["accuracy", "format:0.5", "pkg.mod:f", "pkg.mod:f:-2", "pkg.mod.f", "x/y.py:g:1e-1"])
    assert [(s.target, s.weight, s.builtin) for s in specs] == [
        ("accuracy", 1.0, True), ("format", 0.5, True), ("pkg.mod:f", 1.0, False), ("pkg.mod:f", -2.0, False),
        ("pkg.mod.f", 1.0, False), ("x/y.py:g", 0.1, False)]
    for bad in (["accurcy"], [":2"], [], ["format:inf"]):
        with pytest.raises(UsageError):
            parse_rewards(bad)


def test_accuracy_is_trls_accuracy_reward():
    from trl.rewards import accuracy_reward

    completions = [r"So it is \boxed{\frac{1}{3}}", r"\boxed{0.5}", "The answer is 5", r"$\frac{2}{6}$",
                   r"\boxed{x^2+1}", r"I say \boxed{3}"]
    solutions = [r"\frac{1}{3}", r"\frac{1}{2}", "5", r"\frac{1}{3}", "1+x^2", "not maths at all"]
    ours = _score(["accuracy"], completions, columns={"solution": solutions}).per_func[:, 0].tolist()
    theirs = accuracy_reward(as_completions(completions, True), solutions)
    assert [None if math.isnan(x) else x for x in ours] == theirs
    assert theirs[:3] == [1.0, 1.0, 0.0] and theirs[5] is None


def test_accuracy_reads_the_final_answer_and_plain_answers_when_asked():
    completions = [r"<think>maybe \boxed{4}</think> so \boxed{5}", r"<think>\boxed{5}</think> \boxed{4}", "5",
                   "3 + 2 = 5"]
    strict = _score(["accuracy"], completions, columns={"answer": [5, 5, 5, 5]}).per_func[:, 0].tolist()
    assert strict == [1.0, 0.0, 0.0, 0.0]  # the reasoning's guesses do not count; a bare number needs plain_answers
    loose = _score(["accuracy"], completions, columns={"answer": [5, 5, 5, 5]},
                   options=BuiltinOptions(plain_answers=True)).per_func[:, 0].tolist()
    assert loose == [1.0, 0.0, 1.0, 1.0]


def test_accuracy_without_an_answer_column_names_the_record():
    with pytest.raises(RewardError) as err:
        _score(["accuracy"], ["5"], columns={"question": ["?"]})
    assert "'accuracy'" in err.value.message and "prompts.jsonl line 1" in err.value.message
    assert "'solution' or 'answer'" in err.value.message and err.value.exit_code == 2


def test_format_default_is_qwen3_reasoning_then_an_answer():
    from trl.rewards import think_format_reward

    texts = ["<think>\nwork\n</think>\n\n5", "<think>work</think>", "no tags, 5", "work</think> 5",
             "<think>a</think><think>b</think> 5", "<think>\nwork\n</think>\nThis is my answer."]
    got = _score(["format"], texts).per_func[:, 0].tolist()
    # an answer must follow; the opening tag may be the template's (thinking templates write it)
    assert got == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    trl = think_format_reward(as_completions(texts, True))
    for i in (0, 2, 4, 5):  # where both ask the same thing, TRL's think_format_reward agrees
        assert got[i] == trl[i]
    custom = _score(["format"], ["Answer: 5", "5"], options=BuiltinOptions(format_pattern=r"^Answer: \d+$"))
    assert custom.per_func[:, 0].tolist() == [1.0, 0.0]


def test_length_is_dapos_soft_overlong_penalty():
    from trl.rewards import get_soft_overlong_punishment

    lengths = [10, 16, 17, 18, 20]
    ids = [[7] * n for n in lengths]
    ours = _score(["length"], ["x"] * 5, ids=ids, options=BuiltinOptions(max_completion_length=20, length_window=4))
    theirs = get_soft_overlong_punishment(max_completion_len=20, soft_punish_cache=4)(ids)
    assert ours.per_func[:, 0].tolist() == theirs == [0.0, 0.0, -0.25, -0.5, -1.0]
    default = _score(["length"], ["x"], ids=[[7] * 18], options=BuiltinOptions(max_completion_length=20))
    assert default.per_func[0, 0].item() == -0.5  # a fifth of the maximum: window 4


def _write_module(tmp_path, name="myrewards"):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent('''
        # a reward function written for TRL's GRPOTrainer
        def brevity(prompts, completions, completion_ids, **kwargs):
            """Shorter is better; records of kind 'skip' are not scored."""
            kwargs["log_metric"]("brevity_calls", 1.0)
            return [None if kind == "skip" else 1.0 / len(ids) for ids, kind in zip(completion_ids, kwargs["kind"])]

        def picky(prompts, completions, completion_ids, **kwargs):
            out = []
            for c in completions:
                if "boom" in c[0]["content"]:
                    raise ValueError("cannot score " + c[0]["content"])
                out.append(0.0)
            return out

        def too_few(prompts, completions, **kwargs):
            return [1.0]

        def words(prompts, completions, **kwargs):
            return ["good" for _ in completions]

        def infinite(prompts, completions, **kwargs):
            return [float("inf") for _ in completions]

        def not_a_list(prompts, completions, **kwargs):
            return 3.0
    '''))
    return path


def test_your_trl_style_function_from_a_module_file_and_from_the_path(tmp_path, monkeypatch):
    path = _write_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    columns = {"kind": ["a", "skip", "a", "a"]}
    ids = [[1, 2], [1], [1, 2, 3, 4], [5]]
    for value in (f"{path}:brevity", "myrewards:brevity", "myrewards.brevity"):
        scores = _score([value, "length:2"], ["w"] * 4, columns=columns, ids=ids,
                        options=BuiltinOptions(max_completion_length=3, length_window=1))
        assert scores.names == ["brevity", "length"]
        f = scores.per_func
        assert f[:, 0].tolist()[0] == 0.5 and math.isnan(f[1, 0]) and f[:, 1].tolist() == [0.0, 0.0, -1.0, 0.0]
        # weighted NaN-sum: brevity + 2 x length; the skipped record keeps its length term
        assert scores.total.tolist() == pytest.approx([0.5, 0.0, 0.25 - 2.0, 1.0])
        assert scores.metrics == {"brevity_calls": [1.0]}
        assert scores.means()["brevity"] == pytest.approx((0.5 + 0.25 + 1.0) / 3)


def test_trls_own_reward_functions_run_unchanged():
    completions = [r"<think>x</think> \boxed{2}", "nope"]
    scores = _score(["trl.rewards.think_format_reward", "trl.rewards.accuracy_reward"], completions,
                    columns={"solution": ["2", "2"]})
    assert scores.per_func.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert scores.extra["solution"] == ["2", "2"]  # accuracy_reward logs its columns through log_extra


def test_none_everywhere_is_nan_and_weights_apply():
    from trnqwen.methods.grpo.rewards import total_reward

    per_func = torch.tensor([[1.0, math.nan], [math.nan, math.nan], [0.5, 2.0]])
    total = total_reward(per_func, [2.0, -1.0])
    assert total[0] == 2.0 and math.isnan(total[1]) and total[2] == -1.0


@pytest.mark.parametrize("func, says", [
    ("picky", "raised ValueError: cannot score boom on prompts.jsonl line 3 (completion 3 of 4)"),
    ("too_few", "returned 1 rewards for 4 completions"),
    ("words", "returned 'good' for prompts.jsonl line 1 (completion 1 of 4), not a number"),
    ("infinite", "returned inf for prompts.jsonl line 1"),
    ("not_a_list", "returned float, not a list of 4 rewards"),
])
def test_a_failing_function_is_named_with_the_record(tmp_path, func, says):
    path = _write_module(tmp_path)
    with pytest.raises(RewardError) as err:
        _score([f"{path}:{func}:0.5"], ["a", "b", "boom", "c"])
    assert err.value.exit_code == 2 and isinstance(err.value, UsageError)
    assert f"reward function {func!r} (--reward {path}:{func}:0.5)" in err.value.message
    assert says in err.value.message, err.value.message


def test_functions_that_cannot_be_loaded(tmp_path):
    path = _write_module(tmp_path)
    for value, says in ((f"{path}:nothing", "has no function 'nothing'"),
                        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
                        (f"{tmp_path}/missing.py:f", "does not exist")):
        with pytest.raises(RewardError) as err:
            RewardSet.build(parse_rewards([value]), BuiltinOptions())
        assert says in err.value.message, err.value.message
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('bad import')\n")
    with pytest.raises(RewardError) as err:
        RewardSet.build(parse_rewards([f"{broken}:f"]), BuiltinOptions())
    assert "RuntimeError: bad import" in err.value.message


def test_plain_string_prompts_get_plain_string_completions(tmp_path):
    seen = []

    def spy(prompts, completions, completion_ids, **kwargs):
        seen.append(completions)
        return [0.0] * len(completions)

    rs = RewardSet.build(parse_rewards(["format"]), BuiltinOptions())
    rs.functions.append(spy)
    rs.names.append("spy")
    rs.specs.append(parse_rewards(["x.spy"])[0])
    rs.score(["q"], as_completions(["hi"], False), [[1]], {}, ["r1"])
    rs.score([[{"role": "user", "content": "q"}]], as_completions(["hi"], True), [[1]], {}, ["r1"])
    assert seen == [["hi"], [[{"role": "assistant", "content": "hi"}]]]
