"""One exception hierarchy for the whole library.

Infrastructure faults (a sandbox that cannot start, a store that is down) are
errors; a command that merely fails inside a sandbox is an observation and is
returned, never raised.
"""


class TrialforgeError(Exception):
    """Base of every error trialforge raises on purpose."""


class ConfigError(TrialforgeError):
    """params.yaml or a flow parameter is invalid."""


class SandboxError(TrialforgeError):
    """The sandbox infrastructure failed (engine gone, creation failed, sandbox died)."""

    def __init__(self, message: str, *, cause: str = "unknown") -> None:
        super().__init__(message)
        self.cause = cause


class TaskError(TrialforgeError):
    """A task or its source record is malformed."""


class PatchError(TaskError):
    """A patch does not apply, or is one we must not apply; ``reason`` is a short key for a funnel."""

    def __init__(self, message: str, *, reason: str = "patch_does_not_apply") -> None:
        super().__init__(message)
        self.reason = reason


class RepoError(TaskError):
    """One source record cannot become a task; ``reason`` is the funnel key, the message says why."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StoreError(TrialforgeError):
    """The object store or a dataset in it failed."""


class VerifierError(TrialforgeError):
    """Grading could not produce a trustworthy verdict."""


class PolicyError(TrialforgeError):
    """The policy failed to produce a valid action."""


class InferenceError(TrialforgeError):
    """The inference server a policy samples from did not answer, after retries: infrastructure, like a dead
    sandbox (the episode ends as ``env_error`` and is tried again), never the policy's failure."""
