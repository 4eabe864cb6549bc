"""Training: the sandwich-rule loop with resume, the window sampler, optimizer and mixed
precision rules, and the supernet checkpoint's reader (``train``); what a timed training step
shares with it (``step``). The supernet and compression stages train with it."""
