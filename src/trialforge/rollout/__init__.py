"""Rollouts: the coding environment, policies, and the agent loop that records trajectories."""
