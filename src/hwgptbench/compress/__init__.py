"""One-shot compression of a pretrained dense model (LLaMA-NAS style).

A dense model (trained here, or a Hugging Face LLaMA-family checkpoint) is imported into a
weight-sharing supernet with its heads and MLP channels ordered by importance, fine-tuned
once with the sandwich rule, and searched for Pareto-optimal sub-networks; quantization is
then applied on top. docs/compress.md describes the stages.
"""
