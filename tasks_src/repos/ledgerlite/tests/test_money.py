from decimal import Decimal

import pytest

from ledgerlite import MoneyError, format_money, parse_amount, split_evenly, to_money


def test_to_money_rounds_to_cents() -> None:
    assert to_money("10.499") == Decimal("10.50")
    assert to_money(3) == Decimal("3.00")
    assert str(to_money(Decimal("7"))) == "7.00"


def test_to_money_avoids_float_artefacts() -> None:
    assert to_money(0.1 + 0.2) == Decimal("0.30")


@pytest.mark.parametrize("bad", ["abc", "NaN", True])
def test_to_money_rejects_non_amounts(bad: object) -> None:
    with pytest.raises(MoneyError):
        to_money(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$1,234.50", "1234.50"),
        ("-12", "-12.00"),
        ("(40.00)", "-40.00"),
        (" 7.1 ", "7.10"),
        ("-$5.25", "-5.25"),
        ("€ 3", "3.00"),
    ],
)
def test_parse_amount(text: str, expected: str) -> None:
    assert parse_amount(text) == Decimal(expected)


def test_parse_amount_rejects_empty() -> None:
    with pytest.raises(MoneyError):
        parse_amount("  $ ")


def test_format_money() -> None:
    assert format_money("1234.5") == "$1,234.50"
    assert format_money(Decimal("-0.5")) == "-$0.50"
    assert format_money(12, symbol="€") == "€12.00"


def test_split_evenly_spreads_leftover_cents() -> None:
    assert split_evenly("10.00", 3) == [Decimal("3.34"), Decimal("3.33"), Decimal("3.33")]
    parts = split_evenly("-0.05", 2)
    assert parts == [Decimal("-0.03"), Decimal("-0.02")]
    assert sum(parts) == Decimal("-0.05")


def test_split_evenly_needs_a_positive_count() -> None:
    with pytest.raises(ValueError):
        split_evenly("1.00", 0)
