import datetime as dt
from decimal import Decimal

from ledgerlite import AccountType, Ledger


def make_ledger() -> Ledger:
    ledger = Ledger()
    ledger.open("Assets:Checking", AccountType.ASSET)
    ledger.open("Assets:Savings", AccountType.ASSET)
    ledger.open("Liabilities:CreditCard", AccountType.LIABILITY)
    return ledger


def test_transfer_moves_money_from_source_to_destination() -> None:
    ledger = make_ledger()
    ledger.transfer(dt.date(2024, 4, 1), "Assets:Checking", "Assets:Savings", "100")
    assert ledger.balance("Assets:Savings") == Decimal("100.00")
    assert ledger.balance("Assets:Checking") == Decimal("-100.00")


def test_paying_off_a_card_reduces_the_liability() -> None:
    ledger = make_ledger()
    ledger.transfer(dt.date(2024, 4, 1), "Liabilities:CreditCard", "Assets:Checking", "500", "Card purchase")
    ledger.transfer(dt.date(2024, 4, 20), "Assets:Checking", "Liabilities:CreditCard", "200", "Card payment")
    assert ledger.normal_balance("Liabilities:CreditCard") == Decimal("300.00")
