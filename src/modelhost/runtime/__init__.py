"""Replicas, worker processes, batching and readiness: the only part that runs models."""
