"""Meters of a fixed model on the machine the job runs on: device resolution and identity
(``device``), run conditions (``condition``), latency (``latency``), energy (``energy``),
memory (``memory``), FLOPs (``flops``), int8 quantization (``quantize``), a model and its inputs
under measurement (``runner``), memory-budgeted groups (``budget``, ``groups``), prefill timing
(``prefill``) and a measurement campaign over archs and conditions (``campaign``).

These modules need torch and numpy only (pynvml is imported where NVML is read), so they run on
measurement machines with few packages. The measure, runtime, compression, export and transfer
stages measure with them. Nothing is imported here."""
