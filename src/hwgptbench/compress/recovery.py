"""Recovery fine-tuning of a pruned model with the supernet fine-tune's budget.

A pruning baseline is only a fair rival of the search when it gets the extra training the
supernet got. :func:`recover` trains a fixed :class:`~hwgptbench.model.GPT` with the
``compress.finetune`` params (:class:`~hwgptbench.settings.sections.TrainingSettings`): the
same number of optimizer steps, on the same training windows in the same order (the window of
step s is drawn from ``step_rng(seed, s, 0)``, as the supernet trainer draws it), with the same
AdamW, warm-up and cosine schedule, gradient clipping and (on CUDA) bf16 autocast. What differs
is what the sandwich rule adds: a supernet step back-propagates several sub-networks at once, a
recovery step this one model.

Zeros stay zeros with ``keep_zeros`` (a Wanda model): the gradients of the pruned entries are
masked before each step and the mask is applied again after it, so the number of nonzeros,
and so the matched size, is the same after training.
"""

from __future__ import annotations

import logging

import torch
from tqdm import tqdm

from ..model import GPT
from ..settings.sections import TrainingSettings
from ..training.train import (
    WindowSampler,
    build_optimizer,
    lr_factor,
    step_rng,
    training_autocast,
)

log = logging.getLogger(__name__)


def recover(model: GPT, cfg: TrainingSettings, sampler: WindowSampler, device: torch.device,
            keep_zeros: bool = False) -> GPT:
    """Fine-tune ``model`` in place for ``cfg.steps`` steps (module docstring); returns it in
    eval mode. ``sampler`` draws training windows of the model's block size."""
    model.to(device).train()
    masks = ({name: p != 0 for name, p in model.named_parameters() if not p.all()}
             if keep_zeros else {})
    parameters = dict(model.named_parameters())
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    autocast = training_autocast(device)
    losses = []
    for step in tqdm(range(cfg.steps), desc="recovery fine-tune", unit="step", mininterval=2.0):
        x, y = (t.to(device) for t in sampler.sample(step_rng(cfg.seed, step, 0),
                                                     cfg.batch_size))
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        for name, mask in masks.items():
            grad = parameters[name].grad
            if grad is not None:
                grad.mul_(mask)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, mask in masks.items():
                parameters[name].mul_(mask)
        losses.append(float(loss.detach()))
    log.info("recovery fine-tune of %s: loss %.3f -> %.3f over %d steps",
             model.config.arch.id, losses[0], losses[-1], cfg.steps)
    return model.eval()
