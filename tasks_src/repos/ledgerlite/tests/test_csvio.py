import datetime as dt
import io
from decimal import Decimal
from pathlib import Path

import pytest

from ledgerlite import (
    AccountType,
    CsvFormatError,
    Ledger,
    Transaction,
    export_csv,
    import_csv,
    load_csv,
    read_transactions,
    save_csv,
)

SAMPLE = """date,txn_id,description,account,amount
2024-01-05,A1,Groceries,Expenses:Food,42.10
2024-01-05,A1,Groceries,Assets:Checking,-42.10
2024-01-07,A2,Refund,Assets:Checking,"1,000.00"
2024-01-07,A2,Refund,Expenses:Food,(1000)
"""


def make_ledger() -> Ledger:
    ledger = Ledger()
    ledger.open("Assets:Checking", AccountType.ASSET)
    ledger.open("Expenses:Food", AccountType.EXPENSE)
    return ledger


def test_read_transactions_groups_rows() -> None:
    transactions = read_transactions(io.StringIO(SAMPLE))
    assert [txn.txn_id for txn in transactions] == ["A1", "A2"]
    assert transactions[1].postings[1].amount == Decimal("-1000.00")
    assert all(txn.is_balanced() for txn in transactions)


def test_missing_columns() -> None:
    with pytest.raises(CsvFormatError, match="missing columns: txn_id"):
        read_transactions(io.StringIO("date,description,account,amount\n"))


def test_bad_amount_reports_line_number() -> None:
    text = "date,txn_id,description,account,amount\n2024-01-05,A1,X,Expenses:Food,lots\n"
    with pytest.raises(CsvFormatError, match="line 2"):
        read_transactions(io.StringIO(text))


def test_rows_of_one_transaction_must_share_a_date() -> None:
    text = SAMPLE.replace("2024-01-05,A1,Groceries,Assets", "2024-01-06,A1,Groceries,Assets")
    with pytest.raises(CsvFormatError, match="different dates"):
        read_transactions(io.StringIO(text))


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    txn = Transaction.simple(dt.date(2024, 2, 29), "Leap lunch", "Expenses:Food", "Assets:Checking", "12.5", "L1")
    path = tmp_path / "out.csv"
    assert save_csv([txn], path) == 2
    (loaded,) = load_csv(path)
    assert loaded == txn


def test_import_and_export(tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    source.write_text(SAMPLE, encoding="utf-8")
    ledger = make_ledger()
    assert import_csv(ledger, source) == 2
    assert ledger.balance("Assets:Checking") == Decimal("957.90")
    target = tmp_path / "copy.csv"
    assert export_csv(ledger, target) == 4
    assert target.read_text(encoding="utf-8").splitlines()[1] == "2024-01-05,A1,Groceries,Expenses:Food,42.10"
