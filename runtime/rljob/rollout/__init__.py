"""Rollout: engines that generate responses, and the rollout worker."""
