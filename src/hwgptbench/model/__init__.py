"""GPT models: the fixed model of one arch and the weight-sharing supernet of a search space."""

from .elastic import (
    ElasticBlock,
    ElasticCausalSelfAttention,
    ElasticEmbedding,
    ElasticGatedMLP,
    ElasticLayerNorm,
    ElasticLinear,
    ElasticMLP,
    ElasticRMSNorm,
)
from .gpt import GPT, GPTConfig
from .supernet import SuperGPT

__all__ = [
    "GPT",
    "ElasticBlock",
    "ElasticCausalSelfAttention",
    "ElasticEmbedding",
    "ElasticGatedMLP",
    "ElasticLayerNorm",
    "ElasticLinear",
    "ElasticMLP",
    "ElasticRMSNorm",
    "GPTConfig",
    "SuperGPT",
]
