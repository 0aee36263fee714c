from decimal import Decimal

from ledgerlite import parse_amount, split_evenly, to_money


def test_half_cents_round_away_from_zero() -> None:
    assert to_money("0.125") == Decimal("0.13")
    assert to_money("2.345") == Decimal("2.35")
    assert to_money("-0.125") == Decimal("-0.13")


def test_parsed_and_split_amounts_use_the_same_rounding() -> None:
    assert parse_amount("$1,000.005") == Decimal("1000.01")
    assert split_evenly("0.045", 1) == [Decimal("0.05")]
