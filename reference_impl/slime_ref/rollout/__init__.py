"""Rollout side: the default rollout function, SFT rollout, rewards, dynamic sampling filters, the SGLang
HTTP client, engine and router launch, and the trainer side of weight transfer."""
