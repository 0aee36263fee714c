"""ledgerlite: a tiny double-entry bookkeeping library."""

from ledgerlite.accounts import Account, AccountType, Chart
from ledgerlite.csvio import export_csv, import_csv, load_csv, read_transactions, save_csv, write_transactions
from ledgerlite.errors import (
    AccountTypeMismatchError,
    CsvFormatError,
    LedgerError,
    MoneyError,
    UnbalancedTransactionError,
    UnknownAccountError,
)
from ledgerlite.ledger import Ledger, RegisterLine
from ledgerlite.money import format_money, parse_amount, split_evenly, to_money
from ledgerlite.reports import IncomeStatement, Period, income_statement, month_periods, period_totals
from ledgerlite.transactions import Posting, Transaction

__version__ = "0.4.1"

__all__ = [
    "Account",
    "AccountType",
    "AccountTypeMismatchError",
    "Chart",
    "CsvFormatError",
    "IncomeStatement",
    "Ledger",
    "LedgerError",
    "MoneyError",
    "Period",
    "Posting",
    "RegisterLine",
    "Transaction",
    "UnbalancedTransactionError",
    "UnknownAccountError",
    "export_csv",
    "format_money",
    "import_csv",
    "income_statement",
    "load_csv",
    "month_periods",
    "parse_amount",
    "period_totals",
    "read_transactions",
    "save_csv",
    "split_evenly",
    "to_money",
    "write_transactions",
]
