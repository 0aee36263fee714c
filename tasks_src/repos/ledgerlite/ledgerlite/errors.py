"""Exceptions raised by ledgerlite."""

from __future__ import annotations


class LedgerError(Exception):
    """Base class for every error raised by ledgerlite."""


class MoneyError(LedgerError, ValueError):
    """A value could not be interpreted as an amount of money."""


class UnknownAccountError(LedgerError, KeyError):
    """An account name is not in the chart of accounts."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class AccountTypeMismatchError(LedgerError):
    """An account was re-declared with a different type."""


class UnbalancedTransactionError(LedgerError):
    """A transaction's postings do not sum to zero."""


class CsvFormatError(LedgerError):
    """A CSV file does not have the layout ledgerlite expects."""
