from decimal import Decimal
from pathlib import Path

from ledgerlite import AccountType, Ledger, import_csv, load_csv

ROWS = (
    "date,txn_id,description,account,amount\r\n"
    "2024-03-02,B7,Café Olé,Expenses:Food,4.80\r\n"
    "2024-03-02,B7,Café Olé,Assets:Checking,-4.80\r\n"
)


def test_load_csv_accepts_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "excel-export.csv"
    path.write_bytes(b"\xef\xbb\xbf" + ROWS.encode("utf-8"))
    (txn,) = load_csv(path)
    assert txn.txn_id == "B7"
    assert txn.description == "Café Olé"


def test_import_csv_from_a_spreadsheet_export(tmp_path: Path) -> None:
    path = tmp_path / "bank.csv"
    path.write_text(ROWS, encoding="utf-8-sig", newline="")
    ledger = Ledger()
    ledger.open("Assets:Checking", AccountType.ASSET)
    ledger.open("Expenses:Food", AccountType.EXPENSE)
    assert import_csv(ledger, path) == 1
    assert ledger.balance("Expenses:Food") == Decimal("4.80")
