"""Training backends. Megatron-core is the one backend, as in slime."""
