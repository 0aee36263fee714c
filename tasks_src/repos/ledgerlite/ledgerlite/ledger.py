"""The ledger: a chart of accounts plus a date-ordered journal of transactions."""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

from ledgerlite.accounts import Account, AccountType, Chart
from ledgerlite.money import ZERO, Amount
from ledgerlite.transactions import Transaction


@dataclass(frozen=True)
class RegisterLine:
    date: dt.date
    description: str
    amount: Decimal
    balance: Decimal


class Ledger:
    def __init__(self, chart: Chart | None = None) -> None:
        self.chart = chart if chart is not None else Chart()
        self._journal: list[Transaction] = []

    def open(self, name: str, type: AccountType) -> Account:
        return self.chart.add(name, type)

    @property
    def transactions(self) -> tuple[Transaction, ...]:
        return tuple(self._journal)

    def post(self, txn: Transaction) -> Transaction:
        """Validate ``txn`` and add it to the journal, keeping the journal in date order."""
        txn.validate()
        for account in txn.accounts():
            self.chart.get(account)
        if not txn.txn_id:
            txn.txn_id = f"T{len(self._journal) + 1:05d}"
        bisect.insort_right(self._journal, txn, key=lambda entry: entry.date)
        return txn

    def _names(self, account: str) -> set[str]:
        return {entry.name for entry in self.chart.descendants(account)}

    def balance(self, account: str, as_of: dt.date | None = None) -> Decimal:
        """Debit-positive balance of ``account`` and its children, at the end of day ``as_of``."""
        names = self._names(account)
        total = ZERO
        for txn in self._journal:
            if as_of is not None and txn.date > as_of:
                break
            total += txn.amount_for(names)
        return total

    def normal_balance(self, account: str, as_of: dt.date | None = None) -> Decimal:
        """Balance with the sign people expect: income and liabilities shown as positive."""
        raw = self.balance(account, as_of)
        return raw if self.chart.get(account).type.debit_normal else -raw

    def activity(self, account: str, start: dt.date, end: dt.date) -> Iterator[tuple[Transaction, Decimal]]:
        """Transactions touching ``account`` (or its children) with ``start <= date <= end``."""
        names = self._names(account)
        for txn in self._journal:
            if start <= txn.date <= end and names.intersection(txn.accounts()):
                yield txn, txn.amount_for(names)

    def register(self, account: str) -> list[RegisterLine]:
        """Every movement on ``account`` with a running balance."""
        lines: list[RegisterLine] = []
        running = ZERO
        names = self._names(account)
        for txn in self._journal:
            if names.intersection(txn.accounts()):
                amount = txn.amount_for(names)
                running += amount
                lines.append(RegisterLine(txn.date, txn.description, amount, running))
        return lines

    def trial_balance(self, as_of: dt.date | None = None) -> dict[str, Decimal]:
        """Debit-positive balance of every account that has postings of its own."""
        totals: dict[str, Decimal] = {}
        for txn in self._journal:
            if as_of is not None and txn.date > as_of:
                break
            for posting in txn.postings:
                totals[posting.account] = totals.get(posting.account, ZERO) + posting.amount
        return dict(sorted(totals.items()))

    def transfer(
        self, date: dt.date, source: str, destination: str, amount: Amount, description: str = "Transfer"
    ) -> Transaction:
        """Move ``amount`` out of ``source`` and into ``destination``."""
        return self.post(Transaction.simple(date, description, destination, source, amount))
