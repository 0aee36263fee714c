"""Postings and transactions.

A posting moves an amount into (debit, positive) or out of (credit, negative)
one account. A transaction groups postings that must sum to zero.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

from ledgerlite.errors import UnbalancedTransactionError
from ledgerlite.money import ZERO, Amount, to_money


@dataclass(frozen=True)
class Posting:
    account: str
    amount: Decimal
    memo: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "amount", to_money(self.amount))

    @property
    def is_debit(self) -> bool:
        return self.amount > 0


@dataclass
class Transaction:
    date: dt.date
    description: str
    postings: list[Posting] = field(default_factory=list)
    txn_id: str = ""

    @classmethod
    def simple(
        cls, date: dt.date, description: str, debit: str, credit: str, amount: Amount, txn_id: str = ""
    ) -> Transaction:
        """A two-posting transaction: ``amount`` is debited to one account and credited to another."""
        value = to_money(amount)
        return cls(date, description, [Posting(debit, value), Posting(credit, -value)], txn_id)

    def total(self) -> Decimal:
        return sum((posting.amount for posting in self.postings), ZERO)

    def is_balanced(self) -> bool:
        return self.total() == ZERO

    def validate(self) -> None:
        if len(self.postings) < 2:
            raise UnbalancedTransactionError(f"{self.description!r} needs at least two postings")
        if not self.is_balanced():
            raise UnbalancedTransactionError(f"{self.description!r} is off by {self.total()}")

    def accounts(self) -> list[str]:
        return list(dict.fromkeys(posting.account for posting in self.postings))

    def amount_for(self, accounts: set[str]) -> Decimal:
        """Net amount this transaction posts to any of ``accounts``."""
        return sum((posting.amount for posting in self.postings if posting.account in accounts), ZERO)
