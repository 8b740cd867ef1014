"""GRPO's update pieces inside the ranks, in-process and quick: the reference of a LoRA run is the base
(every B switched off for the forward, the trained adapter back after), and the rollout reused for
``num_iterations`` steps survives a checkpoint's state round trip as it was.  (The parity with TRL's
arithmetic is tests/test_grpo_loss.py; the real run on torchrun, tests/test_grpo_e2e.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("grpo-ref") / "tiny-qwen3")


def test_a_lora_runs_reference_is_its_base_with_the_adapter_off(tiny, monkeypatch):
    from transformers import AutoModelForCausalLM

    from trnqwen.contract.lora import LoraSpec
    from trnqwen.methods.grpo.reference import StartingWeights
    from trnqwen.adapters.lora import titan as lora
    from trnqwen.contract.peft_adapter import is_adapter_key

    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, targets=("q_proj", "v_proj"), seed=0, base_model="tiny")
    monkeypatch.setitem(lora._state, "spec", spec)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    ids = torch.arange(5, 17)[None]
    with torch.no_grad():
        base = model(input_ids=ids).logits
    assert lora.inject_hf_adapters(model, spec) > 0
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter_key(name):
                p.copy_(torch.randn(p.shape, generator=gen))  # a trained adapter: B far from its zero start
        tuned = model(input_ids=ids).logits
    assert (tuned - base).abs().max() > 1e-2
    starting = StartingWeights.capture(model)
    assert starting.params and all(v is None for v in starting.starting)  # B zeroed: no copy of anything kept
    with torch.no_grad():
        with starting.swapped_in():
            reference = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert torch.allclose(reference, base, atol=1e-6) and torch.equal(after, tuned)


def test_the_reused_rollout_round_trips_through_a_checkpoints_state():
    from trnqwen.methods.grpo.replay import Rollouts, RolloutState
    from trnqwen.methods.grpo.rollout import Staged

    gen = torch.Generator().manual_seed(0)

    def item(with_ref: bool) -> Staged:
        return Staged(seq=torch.randint(0, 50, (6, 10), generator=gen), targets=torch.randint(-1, 50, (6, 10), generator=gen),
                      advantages=torch.randn(6, generator=gen), rows=torch.randn(12, 5, generator=gen), tokens=17.0,
                      old_logps=-torch.rand(6, 10, generator=gen), ref_logps=-torch.rand(6, 10, generator=gen) if with_ref else None)

    held = Rollouts(3)
    assert held.due(1) and held.due(5)  # nothing held: sample
    held.fill(4, [item(True), item(True)])
    assert [held.due(s) for s in (4, 5, 6, 7)] == [True, False, False, True]  # steps 1, 4, 7, ... sample
    assert held.tokens == 34.0
    shapes = dict(rank=1, micro_batches=2, rows=6, seq_len=10, world_rows=12, width=5)
    state = RolloutState(held, **shapes).state_dict()
    empty = RolloutState(Rollouts(3), **shapes)  # what a resumed rank holds before the load
    assert {k: v.shape for k, v in empty.state_dict()["rank_1"].items()} == {k: v.shape for k, v in state["rank_1"].items()}
    empty.load_state_dict(state)
    back = empty.rollouts
    assert back.step == 4 and len(back.items) == 2 and not back.due(5)
    for a, b in zip(held.items, back.items):
        for name in ("seq", "targets", "advantages", "rows", "old_logps", "ref_logps"):
            assert torch.equal(getattr(a, name).float(), getattr(b, name).float()), name
    RolloutState(Rollouts(3), rank=0, **{k: v for k, v in shapes.items() if k != "rank"}).load_state_dict(state)  # another rank's key: nothing
    nothing = Rollouts(3)
    RolloutState(nothing, **shapes).load_state_dict(RolloutState(Rollouts(3), **shapes).state_dict())
    assert not nothing.items  # an empty buffer saved stays empty: the resumed run samples
