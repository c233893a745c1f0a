"""What the trainer computes, to compare engines against: HF transformers in float32."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM


@torch.inference_mode()
def hf_logprobs(model, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of tokens 1..n-1 of ``ids`` given their prefix, float32 on CPU."""
    logits = model(torch.tensor([ids], device=model.device)).logits[0].float().cpu()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def perturbed_model(model_dir, seed: int, scale: float = 0.05, round_to: torch.dtype | None = None):
    """The checkpoint with seeded noise added to every weight (float32). ``round_to`` rounds the
    weights to that dtype and back, so an engine computing in it holds exactly these weights."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
            if round_to is not None:
                param.copy_(param.to(round_to).float())
    return model
