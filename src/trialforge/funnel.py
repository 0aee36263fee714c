"""What a pipeline step kept and dropped, and why: every step reports one of these (ingestion's also lists links)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Funnel:
    stage: str
    seen: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    details: list[dict[str, Any]] = field(default_factory=list)
    noted: Counter[str] = field(default_factory=Counter)  # what the records lost on the way, e.g. unstable test ids

    def keep(self) -> None:
        self.seen += 1
        self.kept += 1

    def drop(self, ref: str, reason: str, detail: str = "") -> None:
        """Count a dropped record under a short ``reason`` key; ``detail`` says exactly what was wrong."""
        self.seen += 1
        self.dropped[reason] += 1
        self.details.append({"ref": ref, "reason": reason, "detail": detail})

    def note(self, what: str, count: int) -> None:
        """Count ``count`` things of kind ``what`` that a record (kept or dropped) lost or is marked with, e.g. tests
        left out of it, an underspecified statement."""
        if count:
            self.noted[what] += count

    def absorb(self, other: Funnel) -> None:
        """Count another step's records as this one's (reasons prefixed by its stage): one step, two sources."""
        self.seen += other.seen
        self.kept += other.kept
        self.dropped.update({f"{other.stage}/{reason}": n for reason, n in other.dropped.items()})
        self.details += [d | {"reason": f"{other.stage}/{d['reason']}"} for d in other.details]
        self.noted.update({f"{other.stage}/{what}": n for what, n in other.noted.items()})

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "seen": self.seen,
            "kept": self.kept,
            "dropped": dict(self.dropped),
            "details": self.details,
            "noted": dict(self.noted),
        }


@dataclass
class IngestFunnel(Funnel):
    """A funnel that also lists what was linked to what (ticket -> fix), with confidence and rule."""

    links: list[dict[str, Any]] = field(default_factory=list)

    def link(self, task_id: str, ticket: str, fix: str, confidence: float, rule: str, *, used: bool = True) -> None:
        self.links.append(
            {"task_id": task_id, "ticket": ticket, "fix": fix, "confidence": confidence, "rule": rule, "used": used}
        )

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "links": self.links}
