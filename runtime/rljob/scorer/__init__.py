"""The reward replicas (reward.url): a worker that takes the reward task."""
