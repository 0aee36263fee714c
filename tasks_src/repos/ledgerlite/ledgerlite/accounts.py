"""Accounts and the chart of accounts.

Account names are colon-separated paths such as ``Assets:Bank:Checking``. A
balance asked for ``Assets:Bank`` includes every account below it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from ledgerlite.errors import AccountTypeMismatchError, UnknownAccountError

SEPARATOR = ":"


class AccountType(Enum):
    ASSET = "asset"
    LIABILITY = "liability"
    EQUITY = "equity"
    INCOME = "income"
    EXPENSE = "expense"

    @property
    def debit_normal(self) -> bool:
        """True for account types whose balance normally grows with debits."""
        return self in (AccountType.ASSET, AccountType.EXPENSE)


@dataclass(frozen=True)
class Account:
    name: str
    type: AccountType

    @property
    def parts(self) -> list[str]:
        return self.name.split(SEPARATOR)

    @property
    def parent(self) -> str | None:
        head, sep, _ = self.name.rpartition(SEPARATOR)
        return head if sep else None

    @property
    def leaf(self) -> str:
        return self.parts[-1]

    @property
    def depth(self) -> int:
        return len(self.parts)


def validate_name(name: str) -> str:
    """Return ``name`` if it is a well-formed account path, else raise ValueError."""
    parts = name.split(SEPARATOR)
    if not name or any(not part or part != part.strip() for part in parts):
        raise ValueError(f"invalid account name: {name!r}")
    return name


class Chart:
    """The set of accounts a ledger knows about."""

    def __init__(self) -> None:
        self._accounts: dict[str, Account] = {}

    def add(self, name: str, type: AccountType) -> Account:
        """Declare an account (and any missing parents, with the same type)."""
        validate_name(name)
        existing = self._accounts.get(name)
        if existing is not None:
            if existing.type is not type:
                raise AccountTypeMismatchError(f"{name} is already declared as {existing.type.value}, not {type.value}")
            return existing
        account = Account(name, type)
        if account.parent is not None:
            parent = self._accounts.get(account.parent) or self.add(account.parent, type)
            if parent.type is not type:
                raise AccountTypeMismatchError(f"{name} is a {type.value} under a {parent.type.value} account")
        self._accounts[name] = account
        return account

    def get(self, name: str) -> Account:
        try:
            return self._accounts[name]
        except KeyError:
            raise UnknownAccountError(f"unknown account: {name}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._accounts

    def __iter__(self) -> Iterator[Account]:
        return iter(sorted(self._accounts.values(), key=lambda account: account.name))

    def __len__(self) -> int:
        return len(self._accounts)

    def descendants(self, name: str) -> list[Account]:
        """The account ``name`` and every account below it, sorted by name."""
        self.get(name)
        prefix = name + SEPARATOR
        return [account for account in self if account.name == name or account.name.startswith(prefix)]

    def of_type(self, type: AccountType) -> list[Account]:
        return [account for account in self if account.type is type]
