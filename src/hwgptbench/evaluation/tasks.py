"""A multiple-choice cloze task built from held-out text, scored as lm-eval-harness scores.

LLaMA-NAS scores the sub-networks of a compressed model by perplexity and by the accuracy of
downstream multiple-choice tasks (ARC, HellaSwag, ...), which lm-eval-harness scores by the
log-likelihood of each choice as a continuation of the context: the predicted choice is the
one the model finds most likely. Those tasks are downloads and out of reach of a tiny model,
so this module builds a local stand-in from the held-out (validation) token shards, scored the
same way (:mod:`hwgptbench.evaluation.lm_eval_adapter` runs the real tasks where lm-eval is
installed).

Each item is a random position of the held-out text: the context is the ``context_len``
tokens there, the correct choice the ``choice_len`` tokens that follow, and the other
``n_choices - 1`` choices are spans of ``choice_len`` tokens from other random positions (each
unlike the true continuation and the other choices); the correct choice sits at a random
index. A choice is scored by the summed log-probability of its tokens given the context and its
earlier tokens: the model is fed ``context_len + choice_len - 1`` tokens, which must fit its
context (the defaults, 48 + 16 - 1 = 63, fit a block size of 64). Telling the continuation from
the distractors takes the dependence of the text on its context, which a better language model
captures better.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..training.train import step_rng

log = logging.getLogger(__name__)

CONTEXT_LEN = 48
CHOICE_LEN = 16
N_CHOICES = 4
_MAX_REDRAWS = 100  # distractor draws per choice before the text is declared too repetitive

LanguageModel = Callable[[Tensor], Tensor]
"""Token ids (B, T) int64 → logits (B, T, V), e.g. :class:`~hwgptbench.model.GPT`."""


@dataclass(frozen=True)
class ClozeItems:
    """``n`` multiple-choice items of ``K`` choices of ``L`` tokens after ``C`` context tokens.

    ``context`` (n, C), ``choices`` (n, K, L) and ``answer`` (n,), the index of the true
    continuation among the choices; all int64.
    """

    context: Tensor
    choices: Tensor
    answer: Tensor

    @property
    def chance(self) -> float:
        """The accuracy of guessing: 1 / K."""
        return 1.0 / self.choices.size(1)


class _SpanSampler:
    """Random spans of ``length`` tokens from shards; a shard is drawn in proportion to its
    number of start positions, a start uniformly."""

    def __init__(self, shards: Sequence[np.ndarray], length: int):
        self.shards = [s for s in shards if len(s) >= length]
        starts = np.array([len(s) - length + 1 for s in self.shards], dtype=np.float64)
        self.weights = starts / starts.sum()
        self.length = length

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        shard = self.shards[rng.choice(len(self.shards), p=self.weights)]
        start = int(rng.integers(0, len(shard) - self.length + 1))
        return np.asarray(shard[start:start + self.length], dtype=np.int64)


def _check_args(shards: Sequence[np.ndarray], n_items: int, context_len: int, choice_len: int,
                n_choices: int) -> None:
    for name, value, least in [("n_items", n_items, 1), ("context_len", context_len, 1),
                               ("choice_len", choice_len, 1), ("n_choices", n_choices, 2)]:
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    span = context_len + choice_len
    if not any(len(s) >= span for s in shards):
        raise ValueError(f"shards: no shard has context_len + choice_len = {span} tokens "
                         f"(lengths {[len(s) for s in shards]})")


def _distractors(sampler: _SpanSampler, truth: np.ndarray, count: int,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` spans, each unlike ``truth`` and the others (redrawn while equal)."""
    taken = [truth]
    for _ in range(count * _MAX_REDRAWS):
        span = sampler.draw(rng)
        if not any(np.array_equal(span, t) for t in taken):
            taken.append(span)
            if len(taken) > count:
                return taken[1:]
    raise ValueError(f"shards: the held-out text is too repetitive to draw {count} distinct "
                     f"distractors of choice_len = {len(truth)} tokens")


def build_cloze(shards: Sequence[np.ndarray], n_items: int, context_len: int = CONTEXT_LEN,
                choice_len: int = CHOICE_LEN, n_choices: int = N_CHOICES, seed: int = 0
                ) -> ClozeItems:
    """``n_items`` cloze items from the held-out token ``shards``, drawn from ``seed``.

    A pure function of its arguments. Raises ``ValueError`` naming the argument at fault.
    """
    _check_args(shards, n_items, context_len, choice_len, n_choices)
    windows = _SpanSampler(shards, context_len + choice_len)
    spans = _SpanSampler(shards, choice_len)
    rng = step_rng(seed)
    contexts, choices, answers = [], [], []
    for _ in range(n_items):
        window = windows.draw(rng)
        truth = window[context_len:]
        options = _distractors(spans, truth, n_choices - 1, rng)
        answer = int(rng.integers(n_choices))
        options.insert(answer, truth)
        contexts.append(window[:context_len])
        choices.append(np.stack(options))
        answers.append(answer)
    return ClozeItems(torch.from_numpy(np.stack(contexts)), torch.from_numpy(np.stack(choices)),
                      torch.tensor(answers, dtype=torch.int64))


@torch.inference_mode()
def choice_logliks(model: LanguageModel, items: ClozeItems, *, batch_size: int = 64,
                   device: str | torch.device = "cpu") -> Tensor:
    """(n, K) float64: the log-likelihood of each choice as the continuation of its context.

    Each (item, choice) row feeds ``context + choice[:-1]`` (C + L - 1 tokens) and sums the
    log-softmax probabilities of the choice's tokens (lm-eval's ``loglikelihood``); rows go
    through the model ``batch_size`` at a time on ``device``. The model's mode is left as is.
    """
    n, k, length = items.choices.shape
    targets = items.choices.reshape(n * k, length)
    inputs = torch.cat([items.context.repeat_interleave(k, dim=0), targets[:, :-1]], dim=1)
    sums = []
    for start in range(0, n * k, batch_size):
        x = inputs[start:start + batch_size].to(device)
        y = targets[start:start + batch_size].to(device)
        logprobs = torch.log_softmax(model(x)[:, -length:].float(), dim=-1)
        sums.append(logprobs.gather(-1, y.unsqueeze(-1)).squeeze(-1).sum(dim=1).cpu())
    return torch.cat(sums).double().reshape(n, k)


def score_cloze(model: LanguageModel, items: ClozeItems, *, batch_size: int = 64,
                device: str | torch.device = "cpu") -> dict[str, float | int]:
    """Accuracy of ``model`` on ``items``: the predicted choice is the most likely one.

    Ties split the credit: an item whose answer is one of ``m`` equally most likely choices
    counts ``1/m`` (lm-eval would take the first of them). A model that scores every choice
    alike (uniform logits) thus scores exactly ``chance``, wherever the answers sit.
    Returns accuracy, n_items, chance and mean_loglik_correct (the mean log-likelihood of the
    true continuations).
    """
    logliks = choice_logliks(model, items, batch_size=batch_size, device=device)
    best = logliks == logliks.max(dim=1, keepdim=True).values
    rows = torch.arange(len(logliks))
    credit = best[rows, items.answer].double() / best.sum(dim=1)
    result = {"accuracy": float(credit.mean()), "n_items": len(logliks), "chance": items.chance,
              "mean_loglik_correct": float(logliks[rows, items.answer].mean())}
    log.debug("cloze accuracy %.4f on %d items (chance %.4f)", result["accuracy"], len(logliks),
             items.chance)
    return result
