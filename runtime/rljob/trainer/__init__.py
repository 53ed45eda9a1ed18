"""The trainer: GRPO objective, log-prob computation, the training worker."""
