"""trialforge: infrastructure for agentic RL post-training on executable tasks."""

__version__ = "0.1.0"
