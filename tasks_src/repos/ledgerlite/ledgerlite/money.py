"""Money helpers: parsing, rounding and formatting Decimal amounts.

Every amount in ledgerlite is a :class:`~decimal.Decimal` with exactly two
decimal places, rounded the way invoices and bank statements are.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from ledgerlite.errors import MoneyError

CENT = Decimal("0.01")
ZERO = Decimal("0.00")
_CURRENCY_SYMBOLS = "$€£¥"

Amount = Decimal | int | float | str


def to_money(value: Amount) -> Decimal:
    """Convert ``value`` to a Decimal rounded to whole cents."""
    if isinstance(value, bool):
        raise MoneyError(f"not a monetary amount: {value!r}")
    if isinstance(value, float):
        # repr() gives the shortest string that round-trips, so 0.1 + 0.2 -> "0.30000000000000004".
        value = repr(value)
    try:
        amount = value if isinstance(value, Decimal) else Decimal(value)
    except InvalidOperation as exc:
        raise MoneyError(f"not a monetary amount: {value!r}") from exc
    if not amount.is_finite():
        raise MoneyError(f"not a finite amount: {value!r}")
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def parse_amount(text: str) -> Decimal:
    """Parse an amount as it appears on statements: ``"$1,234.50"``, ``"-12"``, ``"(40.00)"``.

    Parentheses mean a negative amount, as in accounting reports.
    """
    cleaned = text.strip()
    negative = cleaned.startswith("(") and cleaned.endswith(")")
    if negative:
        cleaned = cleaned[1:-1].strip()
    cleaned = cleaned.replace(",", "").replace(" ", "")
    if cleaned[:1] in ("-", "+"):
        sign, cleaned = cleaned[0], cleaned[1:]
    else:
        sign = ""
    cleaned = cleaned.lstrip(_CURRENCY_SYMBOLS)
    if not cleaned:
        raise MoneyError(f"empty amount: {text!r}")
    amount = to_money(sign + cleaned)
    return -amount if negative else amount


def format_money(amount: Amount, symbol: str = "$") -> str:
    """Format an amount with a currency symbol and thousands separators: ``-$1,234.50``."""
    value = to_money(amount)
    sign = "-" if value < 0 else ""
    return f"{sign}{symbol}{abs(value):,.2f}"


def split_evenly(total: Amount, ways: int) -> list[Decimal]:
    """Split ``total`` into ``ways`` parts that differ by at most one cent and sum to ``total``.

    Leftover cents go to the first parts: ``split_evenly("10.00", 3)`` is
    ``[3.34, 3.33, 3.33]``.
    """
    if ways < 1:
        raise ValueError("ways must be at least 1")
    cents = int(to_money(total) / CENT)
    sign = -1 if cents < 0 else 1
    base, leftover = divmod(abs(cents), ways)
    return [Decimal(sign * (base + (1 if i < leftover else 0))) * CENT for i in range(ways)]
