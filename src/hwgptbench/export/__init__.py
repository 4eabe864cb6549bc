"""Export of a fixed sub-network as runnable model files, checked against the model's logits.

``pt2`` (``torch.export``), ``onnx_export`` (ONNX via the dynamo exporter, run by ONNX Runtime),
``hf`` (a Hugging Face ``LlamaForCausalLM`` / ``GPTNeoXForCausalLM`` folder, uniform archs
only); ``check`` says which formats apply and compares logits; ``manifest`` records what was
written; ``write`` loads the source checkpoint and runs the formats (:func:`write.export_arch`).
"""
