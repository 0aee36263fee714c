"""Every way an episode can end, and who answers for it.

A *model* ending is the policy's own outcome: the episode is graded on its diff (status ``ok``, the verifier's reward)
and trained on, whatever went wrong, so a model is taught out of its mistakes rather than excused from them. An
*infrastructure* ending is a fault of the sandbox, the inference server, the clock or the verifier: the reward is
unknown (None), the episode is retried (``env_error``) or dropped, and it never reaches the loss.
The table with the reasons: docs/learning.md, "Who answers for an episode".
"""

from __future__ import annotations

from typing import Literal

from trialforge.errors import TrialforgeError

Side = Literal["model", "infrastructure"]
MODEL: Side = "model"
INFRASTRUCTURE: Side = "infrastructure"

ENDINGS: dict[str, Side] = {
    "submitted": MODEL,  # submit with a change: the verifier decides
    "submitted_unchanged": MODEL,  # submit without changing anything
    "max_turns": MODEL,  # out of turns, malformed replies and refusals to act included
    "context_exhausted": MODEL,  # the next turn did not fit the model's context (rollout.context)
    "invalid_actions": MODEL,  # rollout.max_bad_actions replies in a row that were no valid tool call
    "sandbox": INFRASTRUCTURE,  # a sandbox that died or could not start, past recovery (env_error, retried)
    "inference": INFRASTRUCTURE,  # the inference server's 5xx, timeouts or absence, past retries (env_error)
    # the policy could not act for a reason that is no output of the model (policy_error): a server refusing a
    # well-formed request for reasons of its own, a remote client gone silent, a non-finite log-probability
    "policy_fault": INFRASTRUCTURE,
    "timeout": INFRASTRUCTURE,  # episode wall time, which counts the server's latency and the machine's load
    "verifier": INFRASTRUCTURE,  # grading could not reach a trustworthy verdict (verifier_error)
}
_STATUS = {"policy_error": "policy_fault", "timeout": "timeout", "verifier_error": "verifier"}


class UnknownEndingError(TrialforgeError):
    """An episode ended in a way this module does not classify (a newer writer?)."""


def ending(status: str, termination: str, cause: str, changed: bool) -> str:
    """The key in ``ENDINGS`` of an episode that ended with ``status`` and ``termination`` (``cause`` tells an
    inference fault from a sandbox one; ``changed``: its final diff is not empty)."""
    if status == "ok":
        if termination == "submitted" and not changed:
            return "submitted_unchanged"
        if termination in ENDINGS:
            return termination
    elif status == "env_error":
        return "inference" if cause.startswith("inference:") else "sandbox"
    elif status in _STATUS:
        return _STATUS[status]
    raise UnknownEndingError(
        f"no ending for status {status!r} with termination {termination!r}; known: {sorted(ENDINGS)} "
        "(update trialforge.rollout.endings)"
    )


def counts_by_side(endings: list[str]) -> dict[Side, dict[str, int]]:
    """How many of ``endings`` are each cause, under its side; every cause present, zeros included."""
    out: dict[Side, dict[str, int]] = {MODEL: {}, INFRASTRUCTURE: {}}
    for key, who in ENDINGS.items():
        out[who][key] = endings.count(key)
    return out
