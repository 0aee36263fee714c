"""The environment server: trialforge tasks as online environments for trainers that drive their own rollouts."""
