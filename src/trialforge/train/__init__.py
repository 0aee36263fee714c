"""Policy updates from rollout batches: the GRPO-family loss (``loss``) and the trainers that apply it."""
