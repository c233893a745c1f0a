"""The trainer's actor on megatron-core: one code path for CPU (gloo) and GPU (NCCL).

- :mod:`.cpu_compat`: the small patch set megatron-core needs on a machine without CUDA.
- :mod:`.model`: a GPTModel from an HF ``config.json`` (Qwen2, Qwen3, Llama dense).
- :mod:`.layers`: RMSNorm, RoPE and the fused (flash / SDPA) core attention of our layer spec.
- :mod:`.weights`: HF safetensors into any TP/PP split; HF-named tensors back out, in buckets.
- :mod:`.logprobs`: vocab-parallel log-probs and entropy of the response tokens of packed sequences.
- :mod:`.data`: the data-parallel split and micro-batch schedule of one rollout's train data.
- :mod:`.checkpoint`: atomic ``--save``/``--load`` through megatron's dist_checkpointing.
- :mod:`.optimizer_kernels`: multi-tensor and fused-Adam kernels for megatron's optimizer without TE/apex.
- :mod:`.actor`: ``MegatronActor``: log-probs, ``train(rollout_id, batch)``, save, weight export.
- :mod:`.arguments`: Megatron's flags (names and slime's defaults).
"""
