"""Period reports: monthly periods, activity per period, income statements."""

from __future__ import annotations

import calendar
import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

from ledgerlite.accounts import AccountType
from ledgerlite.ledger import Ledger
from ledgerlite.money import ZERO


@dataclass(frozen=True)
class Period:
    start: dt.date
    end: dt.date  # inclusive

    @property
    def label(self) -> str:
        return f"{self.start:%Y-%m}"

    def __contains__(self, day: object) -> bool:
        return isinstance(day, dt.date) and self.start <= day <= self.end


def month_periods(start: dt.date, end: dt.date) -> list[Period]:
    """Calendar months overlapping ``start``..``end`` (inclusive), clipped to that range."""
    if end < start:
        raise ValueError("end is before start")
    periods: list[Period] = []
    first = start.replace(day=1)
    while first <= end:
        last = first.replace(day=calendar.monthrange(first.year, first.month)[1])
        periods.append(Period(max(first, start), min(last, end)))
        if first.month == 12:
            first = first.replace(year=first.year + 1, month=1)
        else:
            first = first.replace(month=first.month + 1)
    return periods


def period_totals(ledger: Ledger, account: str, start: dt.date, end: dt.date) -> list[tuple[Period, Decimal]]:
    """Net debit-positive movement on ``account`` in each month of the range."""
    return [
        (period, sum((amount for _, amount in ledger.activity(account, period.start, period.end)), ZERO))
        for period in month_periods(start, end)
    ]


@dataclass(frozen=True)
class IncomeStatement:
    start: dt.date
    end: dt.date
    income: dict[str, Decimal] = field(default_factory=dict)
    expenses: dict[str, Decimal] = field(default_factory=dict)

    @property
    def total_income(self) -> Decimal:
        return sum(self.income.values(), ZERO)

    @property
    def total_expenses(self) -> Decimal:
        return sum(self.expenses.values(), ZERO)

    @property
    def net_income(self) -> Decimal:
        return self.total_income - self.total_expenses

    def lines(self) -> list[str]:
        rows = [f"Income statement {self.start.isoformat()} .. {self.end.isoformat()}", "Income"]
        rows += [f"  {name:<30}{amount:>12}" for name, amount in self.income.items()]
        rows += ["Expenses"]
        rows += [f"  {name:<30}{amount:>12}" for name, amount in self.expenses.items()]
        rows += [f"{'Net income':<32}{self.net_income:>12}"]
        return rows


def income_statement(ledger: Ledger, start: dt.date, end: dt.date) -> IncomeStatement:
    """Income (credit-normal, shown positive) and expenses for leaf accounts in the range."""

    def leaf_totals(type: AccountType) -> dict[str, Decimal]:
        totals: dict[str, Decimal] = {}
        accounts = ledger.chart.of_type(type)
        parents = {account.parent for account in accounts}
        for account in accounts:
            if account.name in parents:
                continue
            amount = sum((value for _, value in ledger.activity(account.name, start, end)), ZERO)
            if amount:
                totals[account.name] = amount if type.debit_normal else -amount
        return totals

    return IncomeStatement(start, end, leaf_totals(AccountType.INCOME), leaf_totals(AccountType.EXPENSE))
