"""The project's models as an EleutherAI lm-evaluation-harness (``lm-eval``) language model.

Where ``lm-eval`` is installed (``pip install 'hwgptbench[lm-eval]'``) and its tasks' data can
be had (downloaded, or in the Hugging Face cache), :func:`evaluate_tasks` scores a model on
the real downstream tasks (``arc_easy``, ``hellaswag``, ``lambada_openai``, ...);
:mod:`hwgptbench.evaluation.tasks` is the offline stand-in. ``lm_eval`` is imported only when
used, so this module imports without it.

The adapter follows lm-eval's Hugging Face model: the context and continuation are encoded
together and split where the context's encoding ends (trailing spaces of the context go to
the continuation), an empty context is replaced by the end-of-text token, and inputs longer
than the model's context keep their last ``block_size`` tokens.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..tokens.tokenizer import EOT_TOKEN
from .tasks import LanguageModel

if TYPE_CHECKING:
    from lm_eval.api.model import LM
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'hwgptbench[lm-eval]'"
DEFAULT_MAX_GEN_TOKS = 256


def import_lm_eval() -> Any:
    """The ``lm_eval`` package, or an ImportError that says how to install it."""
    try:
        import lm_eval
    except ImportError as exc:
        raise ImportError(f"lm-eval (lm-evaluation-harness) is not installed: {INSTALL_HINT}"
                          ) from exc
    return lm_eval


@functools.cache
def adapter_class() -> type[LM]:
    """The adapter class, a subclass of ``lm_eval.api.model.TemplateLM`` (built on first use,
    as it needs ``lm_eval``)."""
    import_lm_eval()
    from lm_eval import utils
    from lm_eval.api.model import TemplateLM

    class HwgptLM(TemplateLM):
        """A model callable (token ids (B, T) → logits (B, T, V)) and its tokenizer."""

        def __init__(self, model: LanguageModel, tokenizer: Tokenizer, block_size: int,
                     device: str | torch.device = "cpu", batch_size: int = 16) -> None:
            super().__init__()
            eot = tokenizer.token_to_id(EOT_TOKEN)
            if eot is None:
                raise ValueError(f"tokenizer: no '{EOT_TOKEN}' token")
            if block_size < 1 or batch_size < 1:
                raise ValueError(f"block_size ({block_size}) and batch_size ({batch_size}) "
                                 "must be positive")
            self.model, self.text_tokenizer, self.block_size = model, tokenizer, block_size
            self.batch_size, self._device, self._eot = batch_size, torch.device(device), eot

        @property
        def eot_token_id(self) -> int:
            return self._eot

        def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                       **kwargs: Any) -> list[int]:
            return self.text_tokenizer.encode(string, add_special_tokens=False).ids

        @torch.inference_mode()
        def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                                  disable_tqdm: bool = False, **kwargs: Any
                                  ) -> list[tuple[float, bool]]:
            """(sum of log-probabilities, greedy?) of each request's continuation tokens."""
            order = sorted(range(len(requests)),
                           key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
            results: list[tuple[float, bool]] = [(0.0, True)] * len(requests)
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                scored = self._score_batch([requests[i][1:] for i in chunk])
                for i, result in zip(chunk, scored, strict=True):
                    results[i] = result
            return results

        def _score_batch(self, pairs: list[tuple[list[int], list[int]]]
                         ) -> list[tuple[float, bool]]:
            """Score (context, continuation) pairs in one right-padded forward pass."""
            rows = []
            for context, continuation in pairs:
                if len(continuation) > self.block_size:
                    raise ValueError(f"a continuation of {len(continuation)} tokens exceeds "
                                     f"block_size {self.block_size}")
                rows.append((context + continuation)[-(self.block_size + 1):][:-1])
            width = max(len(row) for row in rows)
            padded = torch.tensor([row + [0] * (width - len(row)) for row in rows],
                                  dtype=torch.int64, device=self._device)
            logits = self.model(padded)
            results = []
            for i, (row, (_, continuation)) in enumerate(zip(rows, pairs, strict=True)):
                if not continuation:
                    results.append((0.0, True))
                    continue
                span = logits[i, len(row) - len(continuation):len(row)].float()
                target = torch.tensor(continuation, device=self._device)
                logprobs = torch.log_softmax(span, dim=-1)
                results.append((float(logprobs.gather(-1, target[:, None]).sum()),
                                bool((span.argmax(dim=-1) == target).all())))
            return results

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                                  ) -> list[float]:
            """Log-likelihood of each document, in windows of up to ``block_size`` tokens."""
            windows, owners = [], []
            for owner, (text,) in enumerate(req.args for req in requests):
                tokens = self.tok_encode(text)
                for context, continuation in map(utils.make_disjoint_window,
                                                 utils.get_rolling_token_windows(
                                                     token_list=tokens,
                                                     prefix_token=self.prefix_token_id,
                                                     max_seq_len=self.block_size,
                                                     context_len=1)):
                    windows.append((None, context, continuation))
                    owners.append(owner)
            totals = [0.0] * len(requests)
            for owner, (loglik, _) in zip(owners, self._loglikelihood_tokens(windows), strict=True):
                totals[owner] += loglik
            return totals

        @torch.inference_mode()
        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            """Greedy continuations, cut at the first ``until`` string, the end-of-text token
            or ``max_gen_toks`` tokens."""
            return [self._generate(context, gen_kwargs)
                    for context, gen_kwargs in (req.args for req in requests)]

        def _generate(self, context: str, gen_kwargs: dict[str, Any]) -> str:
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            tokens = self.tok_encode(context) or [self._eot]
            generated: list[int] = []
            text = ""
            for _ in range(int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))):
                window = torch.tensor([(tokens + generated)[-self.block_size:]],
                                      dtype=torch.int64, device=self._device)
                token = int(self.model(window)[0, -1].argmax())
                if token == self._eot:
                    break
                generated.append(token)
                text = self.text_tokenizer.decode(generated)
                cuts = [text.index(stop) for stop in until if stop in text]
                if cuts:
                    return text[:min(cuts)]
            return text

    return HwgptLM


def make_lm(model: LanguageModel, tokenizer: Tokenizer, block_size: int, *,
            device: str | torch.device = "cpu", batch_size: int = 16) -> LM:
    """``model`` (already on ``device``, in the mode the caller wants: eval) as an lm-eval LM.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` with the end-of-text token; ``block_size`` is
    the model's context length.
    """
    return adapter_class()(model, tokenizer, block_size, device, batch_size)


def evaluate_tasks(model: LanguageModel, tokenizer: Tokenizer, block_size: int,
                   tasks: Sequence[str | dict[str, Any]], *, limit: int | float | None = None,
                   device: str | torch.device = "cpu", batch_size: int = 16,
                   **options: Any) -> dict[str, dict[str, float]]:
    """Per-task metrics of ``model`` on lm-eval ``tasks`` (names, or task config dicts).

    Runs ``lm_eval.simple_evaluate`` on the first ``limit`` examples of each task (all with
    None); ``options`` go to it too (``num_fewshot``, ``bootstrap_iters``, ...). It seeds
    Python's, NumPy's and torch's global generators. Metrics are keyed by lm-eval's names,
    without the suffix of the default filter (``acc``, ``acc_stderr``, ``acc_norm``, ...);
    metrics that are not numbers (an unavailable stderr) are left out.
    """
    lm_eval = import_lm_eval()
    lm = make_lm(model, tokenizer, block_size, device=device, batch_size=batch_size)
    output = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit, **options)
    metrics = {task: {name.removesuffix(",none"): float(value)
                      for name, value in values.items()
                      if isinstance(value, (int, float)) and not isinstance(value, bool)}
               for task, values in output["results"].items()}
    log.info("lm-eval results: %s", metrics)
    return metrics
