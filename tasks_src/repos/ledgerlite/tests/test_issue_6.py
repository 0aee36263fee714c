import datetime as dt
from decimal import Decimal

from ledgerlite import AccountType, Chart, Ledger, Transaction


def test_descendants_do_not_include_accounts_sharing_a_name_prefix() -> None:
    chart = Chart()
    chart.add("Assets:Bank:Checking", AccountType.ASSET)
    chart.add("Assets:Banking:Fees", AccountType.ASSET)
    names = [account.name for account in chart.descendants("Assets:Bank")]
    assert names == ["Assets:Bank", "Assets:Bank:Checking"]


def test_parent_balance_ignores_similarly_named_sibling() -> None:
    ledger = Ledger()
    ledger.open("Assets:Card", AccountType.ASSET)
    ledger.open("Assets:Cardholder:Deposit", AccountType.ASSET)
    ledger.open("Equity:Opening", AccountType.EQUITY)
    ledger.post(Transaction.simple(dt.date(2024, 1, 1), "Open", "Assets:Card", "Equity:Opening", "10"))
    ledger.post(Transaction.simple(dt.date(2024, 1, 1), "Deposit", "Assets:Cardholder:Deposit", "Equity:Opening", "90"))
    assert ledger.balance("Assets:Card") == Decimal("10.00")
    assert ledger.balance("Assets") == Decimal("100.00")
