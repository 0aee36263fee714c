import datetime as dt
from decimal import Decimal

import pytest

from ledgerlite import AccountType, Ledger, Posting, Transaction, UnbalancedTransactionError, UnknownAccountError


@pytest.fixture
def ledger() -> Ledger:
    ledger = Ledger()
    ledger.open("Assets:Checking", AccountType.ASSET)
    ledger.open("Assets:Savings", AccountType.ASSET)
    ledger.open("Income:Salary", AccountType.INCOME)
    ledger.open("Expenses:Rent", AccountType.EXPENSE)
    ledger.open("Equity:Opening", AccountType.EQUITY)
    ledger.post(Transaction.simple(dt.date(2024, 1, 1), "Opening", "Assets:Checking", "Equity:Opening", "500"))
    ledger.post(Transaction.simple(dt.date(2024, 1, 25), "Salary", "Assets:Checking", "Income:Salary", "3000"))
    ledger.post(Transaction.simple(dt.date(2024, 2, 1), "Rent", "Expenses:Rent", "Assets:Checking", "1200"))
    return ledger


def test_post_rejects_unbalanced_transactions(ledger: Ledger) -> None:
    txn = Transaction(dt.date(2024, 3, 1), "Oops", [Posting("Assets:Checking", "10"), Posting("Income:Salary", "-9")])
    with pytest.raises(UnbalancedTransactionError, match=r"off by 1\.00"):
        ledger.post(txn)


def test_post_rejects_single_posting(ledger: Ledger) -> None:
    with pytest.raises(UnbalancedTransactionError):
        ledger.post(Transaction(dt.date(2024, 3, 1), "Lonely", [Posting("Assets:Checking", "0")]))


def test_post_rejects_unknown_accounts(ledger: Ledger) -> None:
    with pytest.raises(UnknownAccountError):
        ledger.post(Transaction.simple(dt.date(2024, 3, 1), "Gift", "Assets:Wallet", "Income:Salary", "5"))


def test_balances(ledger: Ledger) -> None:
    assert ledger.balance("Assets:Checking") == Decimal("2300.00")
    assert ledger.balance("Assets") == Decimal("2300.00")
    assert ledger.balance("Income:Salary") == Decimal("-3000.00")
    assert ledger.normal_balance("Income:Salary") == Decimal("3000.00")
    assert ledger.normal_balance("Expenses:Rent") == Decimal("1200.00")


def test_balance_as_of(ledger: Ledger) -> None:
    assert ledger.balance("Assets:Checking", as_of=dt.date(2024, 1, 31)) == Decimal("3500.00")
    assert ledger.balance("Assets:Checking", as_of=dt.date(2023, 12, 31)) == Decimal("0.00")


def test_journal_stays_in_date_order(ledger: Ledger) -> None:
    late = ledger.post(Transaction.simple(dt.date(2024, 1, 10), "Coffee", "Expenses:Rent", "Assets:Checking", "3"))
    assert [txn.date.day for txn in ledger.transactions] == [1, 10, 25, 1]
    assert late.txn_id == "T00004"


def test_register_running_balance(ledger: Ledger) -> None:
    lines = ledger.register("Assets:Checking")
    assert [line.balance for line in lines] == [Decimal("500.00"), Decimal("3500.00"), Decimal("2300.00")]
    assert lines[-1].amount == Decimal("-1200.00")


def test_trial_balance_sums_to_zero(ledger: Ledger) -> None:
    totals = ledger.trial_balance()
    assert sum(totals.values()) == 0
    assert list(totals) == sorted(totals)
    assert "Expenses:Rent" not in ledger.trial_balance(as_of=dt.date(2024, 1, 31))


def test_transfer_posts_a_balanced_pair(ledger: Ledger) -> None:
    txn = ledger.transfer(dt.date(2024, 2, 2), "Assets:Checking", "Assets:Savings", "250")
    assert txn.is_balanced()
    assert set(txn.accounts()) == {"Assets:Checking", "Assets:Savings"}
    assert txn.description == "Transfer"
    assert ledger.balance("Assets") == Decimal("2300.00")


def test_balance_as_of_includes_transactions_on_that_day(ledger: Ledger) -> None:
    ledger.post(Transaction.simple(dt.date(2024, 2, 29), "Bonus", "Assets:Checking", "Income:Salary", "417.25"))
    assert ledger.balance("Assets:Checking", as_of=dt.date(2024, 2, 29)) == Decimal("2717.25")
    assert ledger.normal_balance("Income:Salary", as_of=dt.date(2024, 2, 29)) == Decimal("3417.25")
    assert ledger.balance("Assets:Checking", as_of=dt.date(2024, 2, 1)) == ledger.balance("Assets:Checking") - Decimal("417.25")
