import datetime as dt
from decimal import Decimal

import pytest

from ledgerlite import AccountType, Ledger, Period, Transaction, income_statement, month_periods, period_totals


@pytest.fixture
def ledger() -> Ledger:
    ledger = Ledger()
    ledger.open("Assets:Checking", AccountType.ASSET)
    ledger.open("Income:Salary", AccountType.INCOME)
    ledger.open("Income:Interest", AccountType.INCOME)
    ledger.open("Expenses:Rent", AccountType.EXPENSE)
    ledger.open("Expenses:Food:Groceries", AccountType.EXPENSE)
    entries = [
        (dt.date(2024, 3, 1), "Rent", "Expenses:Rent", "Assets:Checking", "900"),
        (dt.date(2024, 3, 15), "Pay", "Assets:Checking", "Income:Salary", "2500"),
        (dt.date(2024, 3, 20), "Food", "Expenses:Food:Groceries", "Assets:Checking", "120.40"),
        (dt.date(2024, 4, 1), "Rent", "Expenses:Rent", "Assets:Checking", "900"),
        (dt.date(2024, 4, 30), "Interest", "Assets:Checking", "Income:Interest", "1.23"),
    ]
    for day, description, debit, credit, amount in entries:
        ledger.post(Transaction.simple(day, description, debit, credit, amount))
    return ledger


def test_month_periods_are_clipped_to_the_range() -> None:
    periods = month_periods(dt.date(2024, 1, 15), dt.date(2024, 3, 10))
    assert [period.label for period in periods] == ["2024-01", "2024-02", "2024-03"]
    assert periods[0].start == dt.date(2024, 1, 15)
    assert periods[1].end == dt.date(2024, 2, 29)
    assert periods[2].end == dt.date(2024, 3, 10)


def test_month_periods_rejects_reversed_range() -> None:
    with pytest.raises(ValueError):
        month_periods(dt.date(2024, 2, 1), dt.date(2024, 1, 1))


def test_period_contains() -> None:
    period = Period(dt.date(2024, 5, 1), dt.date(2024, 5, 31))
    assert dt.date(2024, 5, 31) in period
    assert dt.date(2024, 6, 1) not in period
    assert "2024-05-02" not in period


def test_period_totals(ledger: Ledger) -> None:
    totals = period_totals(ledger, "Expenses", dt.date(2024, 3, 1), dt.date(2024, 5, 31))
    assert [(period.label, amount) for period, amount in totals] == [
        ("2024-03", Decimal("1020.40")),
        ("2024-04", Decimal("900.00")),
        ("2024-05", Decimal("0.00")),
    ]


def test_income_statement(ledger: Ledger) -> None:
    report = income_statement(ledger, dt.date(2024, 3, 1), dt.date(2024, 4, 30))
    assert report.income == {"Income:Interest": Decimal("1.23"), "Income:Salary": Decimal("2500.00")}
    assert report.expenses == {"Expenses:Food:Groceries": Decimal("120.40"), "Expenses:Rent": Decimal("1800.00")}
    assert report.net_income == Decimal("580.83")
    assert report.lines()[-1].endswith("580.83")


def test_income_statement_for_a_quiet_period(ledger: Ledger) -> None:
    report = income_statement(ledger, dt.date(2024, 6, 1), dt.date(2024, 6, 30))
    assert report.income == {}
    assert report.net_income == Decimal("0.00")
