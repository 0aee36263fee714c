import datetime as dt
from decimal import Decimal

from ledgerlite import AccountType, Ledger, Transaction, month_periods, period_totals


def test_month_periods_across_new_year() -> None:
    periods = month_periods(dt.date(2023, 11, 20), dt.date(2024, 2, 5))
    assert [period.label for period in periods] == ["2023-11", "2023-12", "2024-01", "2024-02"]
    assert periods[1].end == dt.date(2023, 12, 31)
    assert periods[-1].end == dt.date(2024, 2, 5)


def test_period_totals_for_december() -> None:
    ledger = Ledger()
    ledger.open("Assets:Checking", AccountType.ASSET)
    ledger.open("Expenses:Gifts", AccountType.EXPENSE)
    ledger.post(Transaction.simple(dt.date(2024, 12, 24), "Presents", "Expenses:Gifts", "Assets:Checking", "75"))
    ((period, amount),) = period_totals(ledger, "Expenses", dt.date(2024, 12, 1), dt.date(2024, 12, 31))
    assert period.label == "2024-12"
    assert amount == Decimal("75.00")
