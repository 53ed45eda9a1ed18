"""The reward replicas (reward.url, reward.model): a worker that takes the reward task."""
