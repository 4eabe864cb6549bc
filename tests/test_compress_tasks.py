"""Downstream accuracy for compression: the held-out cloze task and the lm-eval adapter.

Cloze items are a pure function of their seed, follow the held-out text and have distinct
distractors; scoring is lm-eval's summed log-likelihood (checked by hand on a tiny GPT), a
model that knows the text scores 1 and a uniform one exactly chance. The adapter's
log-likelihoods, rolling log-likelihoods and greedy generations equal direct computation.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from torch import Tensor

from hwgptbench.evaluation import lm_eval_adapter
from hwgptbench.evaluation.tasks import ClozeItems, build_cloze, choice_logliks, score_cloze
from hwgptbench.model import GPT, GPTConfig
from hwgptbench.space import SearchSpace
from hwgptbench.tokens.tokenizer import EOT_TOKEN, train_bpe

VOCAB = 50
SPACE = SearchSpace.from_dict("t", {
    "embed_dim": [32], "n_layer": [2], "n_head": [2], "mlp_ratio": [2], "bias": [True],
    "head_size": 16, "block_size": 64, "rotary_fraction": 0.5})
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot and bright",
         "the cat and the dog sat in the sun"]

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                   reason="lm-eval is not installed (hwgptbench[lm-eval])")


@pytest.fixture(scope="module")
def shards() -> list[np.ndarray]:
    """Random held-out text: two usable shards and one too short for any item."""
    rng = np.random.default_rng(0)
    return [rng.integers(VOCAB, size=n).astype(np.uint16) for n in (2000, 600, 5)]


def tiny_gpt(vocab: int = VOCAB) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_space(SPACE, SPACE.largest(), vocab_size=vocab)).eval()


def occurs(span: Tensor, shards: list[np.ndarray]) -> bool:
    """Whether ``span`` is a contiguous piece of a shard."""
    target = span.numpy()
    return any(len(s) >= len(target) and bool(
        (np.lib.stride_tricks.sliding_window_view(s.astype(np.int64), len(target))
         == target).all(axis=1).any()) for s in shards)


def test_items_are_a_function_of_the_seed(shards: list[np.ndarray]) -> None:
    a = build_cloze(shards, 30, 8, 4, 3, seed=1)
    b = build_cloze(shards, 30, 8, 4, 3, seed=1)
    c = build_cloze(shards, 30, 8, 4, 3, seed=2)
    assert all(torch.equal(x, y) for x, y in zip((a.context, a.choices, a.answer),
                                                 (b.context, b.choices, b.answer), strict=True))
    assert not torch.equal(a.context, c.context)
    assert not torch.equal(a.answer, c.answer)


def test_items_follow_the_text_with_distinct_distractors(shards: list[np.ndarray]) -> None:
    items = build_cloze(shards, 200, 8, 4, 4, seed=3)
    assert items.context.shape == (200, 8) and items.choices.shape == (200, 4, 4)
    assert items.context.dtype == items.choices.dtype == items.answer.dtype == torch.int64
    assert items.chance == 0.25
    counts = torch.bincount(items.answer, minlength=4)
    assert len(counts) == 4 and counts.min() >= 30  # the answer's index is random
    first = zip(items.context[:40], items.choices[:40], items.answer[:40], strict=True)
    for context, choices, answer in first:
        assert occurs(torch.cat([context, choices[answer]]), shards)
        assert all(occurs(choice, shards) for choice in choices)
        assert len({tuple(choice.tolist()) for choice in choices}) == 4


def test_distractors_are_redrawn_in_repetitive_text() -> None:
    """Text of two tokens has four spans of two: the choices of an item are all of them."""
    shards = [np.random.default_rng(1).integers(2, size=300).astype(np.uint16)]
    items = build_cloze(shards, 30, 3, 2, 4, seed=0)
    for choices in items.choices:
        assert sorted(map(tuple, choices.tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"n_choices": 1}, "n_choices"), ({"context_len": 0}, "context_len"),
    ({"choice_len": 0}, "choice_len"), ({"n_items": 0}, "n_items"),
    ({"context_len": 2000}, "shards"), ({"shards": []}, "shards"),
    ({"shards": [np.zeros(100, dtype=np.uint16)]}, "repetitive")])
def test_bad_arguments_are_named(shards: list[np.ndarray], kwargs: dict, name: str) -> None:
    args = {"shards": shards, "n_items": 5, "context_len": 8, "choice_len": 4,
            "n_choices": 3, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=name):
        build_cloze(**args)


def oracle(shards: list[np.ndarray]) -> Callable[[Tensor], Tensor]:
    """A model that knows the text: a large logit on every token that follows the last three
    tokens somewhere in the shards."""
    following: dict[tuple[int, ...], set[int]] = {}
    for shard in shards:
        tokens = shard.tolist()
        for i in range(3, len(tokens)):
            following.setdefault(tuple(tokens[i - 3:i]), set()).add(tokens[i])

    def model(idx: Tensor) -> Tensor:
        logits = torch.zeros(*idx.shape, VOCAB)
        for b, row in enumerate(idx.tolist()):
            for t in range(2, len(row)):
                for token in following.get(tuple(row[t - 2:t + 1]), ()):
                    logits[b, t, token] = 20.0
        return logits

    return model


def test_a_model_that_knows_the_text_is_always_right(shards: list[np.ndarray]) -> None:
    items = build_cloze(shards, 40, 8, 4, 4, seed=5)
    result = score_cloze(oracle(shards), items, batch_size=7)
    assert result["accuracy"] == 1.0
    assert result["n_items"] == 40 and result["chance"] == 0.25
    assert -1.0 < result["mean_loglik_correct"] <= 0.0


def test_a_uniform_model_scores_exactly_chance(shards: list[np.ndarray]) -> None:
    items = build_cloze(shards, 25, 8, 4, 3, seed=6)
    result = score_cloze(lambda idx: torch.zeros(*idx.shape, VOCAB), items, batch_size=16)
    assert result["accuracy"] == pytest.approx(1 / 3)
    assert result["mean_loglik_correct"] == pytest.approx(-4 * math.log(VOCAB))


def test_ties_split_the_credit() -> None:
    """Choices 0 and 1 tie as the most likely: an answer among them gets half the credit."""
    items = ClozeItems(context=torch.zeros(3, 2, dtype=torch.int64),
                       choices=torch.tensor([[[1], [1], [2]]] * 3),
                       answer=torch.tensor([0, 1, 2]))
    likes_one = torch.zeros(VOCAB)
    likes_one[1] = 5.0
    result = score_cloze(lambda idx: likes_one.expand(*idx.shape, VOCAB), items)
    assert result["accuracy"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)


def test_logliks_equal_a_hand_computation_on_a_tiny_gpt(shards: list[np.ndarray]) -> None:
    model = tiny_gpt()
    items = build_cloze(shards, 3, 8, 5, 3, seed=7)
    logliks = choice_logliks(model, items, batch_size=2)
    assert torch.allclose(logliks, choice_logliks(model, items, batch_size=9), atol=1e-5)
    context, choices = items.context[0], items.choices[0]
    expected = []
    with torch.no_grad():
        for choice in choices:
            sequence = torch.cat([context, choice])
            logprobs = torch.log_softmax(model(sequence[None, :-1])[0], dim=-1)
            expected.append(sum(float(logprobs[7 + i, token]) for i, token in enumerate(choice)))
    assert logliks[0].tolist() == pytest.approx(expected, abs=1e-4)
    one = ClozeItems(items.context[:1], items.choices[:1], items.answer[:1])
    result = score_cloze(model, one)
    assert result["mean_loglik_correct"] == pytest.approx(expected[int(items.answer[0])],
                                                          abs=1e-4)
    assert result["accuracy"] == float(int(np.argmax(expected)) == int(items.answer[0]))


def test_the_adapter_asks_for_lm_eval_when_it_is_missing(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    importlib.reload(lm_eval_adapter)  # the module imports without lm_eval
    lm_eval_adapter.adapter_class.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"hwgptbench\[lm-eval\]"):
            lm_eval_adapter.evaluate_tasks(tiny_gpt(), None, 64, ["arc_easy"])
        with pytest.raises(ImportError, match=r"hwgptbench\[lm-eval\]"):
            lm_eval_adapter.make_lm(tiny_gpt(), None, 64)
    finally:
        lm_eval_adapter.adapter_class.cache_clear()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_bpe(iter(TEXTS), len(TEXTS), vocab_size=300, min_frequency=1)


def direct_loglik(model: GPT, context: list[int], continuation: list[int]
                  ) -> tuple[float, bool]:
    with torch.no_grad():
        logits = model(torch.tensor([context + continuation[:-1]]))[0, len(context) - 1:]
    target = torch.tensor(continuation)
    logprob = float(torch.log_softmax(logits, dim=-1).gather(-1, target[:, None]).sum())
    return logprob, bool((logits.argmax(dim=-1) == target).all())


@needs_lm_eval
def test_adapter_loglikelihood_equals_direct_scoring(tokenizer: Tokenizer) -> None:
    from lm_eval.api.instance import Instance

    model = tiny_gpt(tokenizer.get_vocab_size())
    lm = lm_eval_adapter.make_lm(model, tokenizer, 64, batch_size=2)
    eot = tokenizer.token_to_id(EOT_TOKEN)
    long_context = " ".join(TEXTS * 4)
    pairs = [("the cat sat on the", " mat"), ("a dog ran in the ", "park today"),
             ("", "the sun is hot"), (long_context, " and bright")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = lm.loglikelihood(requests)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text).ids

    expected = []
    for context, continuation in pairs:
        if not context:
            ids = [eot], encode(continuation)
        else:
            stripped = context.rstrip()
            whole = encode(context + continuation)
            ids = whole[:len(encode(stripped))], whole[len(encode(stripped)):]
        tokens = (ids[0] + ids[1])[-65:]
        expected.append(direct_loglik(model, tokens[:-len(ids[1])], ids[1]))
    assert len(encode(long_context)) > 64  # the last pair is truncated to the context
    for (logprob, greedy), (want, want_greedy) in zip(got, expected, strict=True):
        assert logprob == pytest.approx(want, abs=1e-4) and greedy == want_greedy


@needs_lm_eval
def test_adapter_rolling_loglikelihood_equals_direct_windows(tokenizer: Tokenizer) -> None:
    from lm_eval.api.instance import Instance

    model = tiny_gpt(tokenizer.get_vocab_size())
    block = 8
    lm = lm_eval_adapter.make_lm(model, tokenizer, block, batch_size=3)
    text = " ".join(TEXTS)
    sequence = [tokenizer.token_to_id(EOT_TOKEN), *tokenizer.encode(text).ids]
    assert len(sequence) > 2 * block
    expected, end = 0.0, 1  # windows predict `block` tokens each, from `block` tokens before
    while end < len(sequence):
        stop = min(end + block, len(sequence))
        start = max(0, stop - 1 - block)
        expected += direct_loglik(model, sequence[start:end], sequence[end:stop])[0]
        end = stop
    [rolling] = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert rolling == pytest.approx(expected, abs=1e-3)


@needs_lm_eval
def test_adapter_generates_greedily_until_a_stop(tokenizer: Tokenizer) -> None:
    """A scripted model emits " sat on the mat" then the end-of-text token after the prompt."""
    from lm_eval.api.instance import Instance

    prompt = "the cat"
    prompt_len = len(tokenizer.encode(prompt).ids)
    script = [*tokenizer.encode(" sat on the mat").ids, tokenizer.token_to_id(EOT_TOKEN)]

    def model(idx: Tensor) -> Tensor:
        logits = torch.zeros(*idx.shape, tokenizer.get_vocab_size())
        logits[:, -1, script[idx.size(1) - prompt_len]] = 1.0
        return logits

    lm = lm_eval_adapter.make_lm(model, tokenizer, 16)
    requests = [Instance("generate_until", {}, (prompt, kwargs), i) for i, kwargs in enumerate([
        {"until": ["\n\n"], "max_gen_toks": 50}, {"until": " the", "max_gen_toks": 50},
        {"until": [], "max_gen_toks": 2}])]
    assert lm.generate_until(requests) == [" sat on the mat", " sat on",
                                           tokenizer.decode(script[:2])]


@needs_lm_eval
def test_evaluate_tasks_runs_a_local_multiple_choice_task(tokenizer: Tokenizer,
                                                          tmp_path: Path) -> None:
    """A task config dict over a local JSON file (lm-eval's own tasks are downloads)."""
    from lm_eval.tasks import TaskManager

    docs = [{"context": "the cat sat on the", "choices": ["mat", "dog", "sun"], "label": 0},
            {"context": "a dog ran in the", "choices": ["park", "hot", "cat"], "label": 1},
            {"context": "the sun is", "choices": ["hot", "mat", "park"], "label": 2}]
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    task = {"task": "local_mc", "dataset_path": "json", "test_split": "test",
            "dataset_kwargs": {"data_files": {"test": str(data)},
                               "cache_dir": str(tmp_path / "cache")},
            "output_type": "multiple_choice", "doc_to_text": "{{context}}",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    model = tiny_gpt(tokenizer.get_vocab_size())
    metrics = lm_eval_adapter.evaluate_tasks(
        model, tokenizer, 64, [task], bootstrap_iters=0,
        task_manager=TaskManager(include_defaults=False))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text).ids

    right = 0
    for doc in docs:
        context = encode(doc["context"])
        scores = [direct_loglik(model, context,  # lm-eval puts a space before each choice
                                encode(f"{doc['context']} {choice}")[len(context):])[0]
                  for choice in doc["choices"]]
        right += int(np.argmax(scores)) == doc["label"]
    assert metrics["local_mc"]["acc"] == pytest.approx(right / len(docs))
