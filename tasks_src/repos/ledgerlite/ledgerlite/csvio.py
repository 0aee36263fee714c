"""CSV import and export.

One row per posting::

    date,txn_id,description,account,amount
    2024-01-05,T00001,Groceries,Expenses:Food,42.10
    2024-01-05,T00001,Groceries,Assets:Checking,-42.10

Rows sharing a ``txn_id`` form one transaction.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from ledgerlite.errors import CsvFormatError, MoneyError
from ledgerlite.ledger import Ledger
from ledgerlite.money import parse_amount
from ledgerlite.transactions import Posting, Transaction

FIELDS = ("date", "txn_id", "description", "account", "amount")


def write_transactions(transactions: Iterable[Transaction], stream: TextIO) -> int:
    """Write ``transactions`` as CSV rows to ``stream``; return the number of rows written."""
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(FIELDS)
    rows = 0
    for txn in transactions:
        for posting in txn.postings:
            writer.writerow([txn.date.isoformat(), txn.txn_id, txn.description, posting.account, f"{posting.amount}"])
            rows += 1
    return rows


def read_transactions(stream: TextIO) -> list[Transaction]:
    """Parse CSV rows from ``stream`` into transactions, in order of first appearance."""
    reader = csv.DictReader(stream)
    missing = [name for name in FIELDS if name not in (reader.fieldnames or [])]
    if missing:
        raise CsvFormatError(f"missing columns: {', '.join(missing)}")
    grouped: dict[str, Transaction] = {}
    for line_no, row in enumerate(reader, start=2):
        try:
            date = dt.date.fromisoformat(row["date"].strip())
            amount = parse_amount(row["amount"])
        except (ValueError, MoneyError) as exc:
            raise CsvFormatError(f"line {line_no}: {exc}") from exc
        key = row["txn_id"].strip() or f"line-{line_no}"
        txn = grouped.get(key)
        if txn is None:
            txn = grouped[key] = Transaction(date, row["description"].strip(), [], key)
        elif txn.date != date:
            raise CsvFormatError(f"line {line_no}: transaction {key} has rows on different dates")
        txn.postings.append(Posting(row["account"].strip(), amount))
    return list(grouped.values())


def load_csv(path: str | Path) -> list[Transaction]:
    """Read transactions from a CSV file (as written by :func:`save_csv` or a spreadsheet)."""
    with open(path, newline="", encoding="utf-8-sig") as stream:
        return read_transactions(stream)


def save_csv(transactions: Iterable[Transaction], path: str | Path) -> int:
    with open(path, "w", newline="", encoding="utf-8") as stream:
        return write_transactions(transactions, stream)


def import_csv(ledger: Ledger, path: str | Path) -> int:
    """Post every transaction in the CSV file at ``path``; return how many were posted."""
    transactions = load_csv(path)
    for txn in transactions:
        ledger.post(txn)
    return len(transactions)


def export_csv(ledger: Ledger, path: str | Path) -> int:
    return save_csv(ledger.transactions, path)
