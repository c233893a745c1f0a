"""Rollout: the SGLang HTTP client, engine and router launch, and the trainer side of weight transfer."""
