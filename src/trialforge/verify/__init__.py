"""Verification: grade an agent's diff in a clean sandbox with pristine tests."""
