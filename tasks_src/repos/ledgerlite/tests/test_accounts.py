import pytest

from ledgerlite import AccountType, AccountTypeMismatchError, Chart, UnknownAccountError


@pytest.fixture
def chart() -> Chart:
    chart = Chart()
    chart.add("Assets:Bank:Checking", AccountType.ASSET)
    chart.add("Assets:Cash", AccountType.ASSET)
    chart.add("Expenses:Food", AccountType.EXPENSE)
    return chart


def test_add_creates_missing_parents(chart: Chart) -> None:
    assert "Assets" in chart
    assert "Assets:Bank" in chart
    assert chart.get("Assets:Bank").type is AccountType.ASSET
    assert len(chart) == 6


def test_account_path_properties(chart: Chart) -> None:
    account = chart.get("Assets:Bank:Checking")
    assert account.parent == "Assets:Bank"
    assert account.leaf == "Checking"
    assert account.depth == 3
    assert chart.get("Assets").parent is None


def test_redeclaring_with_another_type_fails(chart: Chart) -> None:
    with pytest.raises(AccountTypeMismatchError):
        chart.add("Assets:Cash", AccountType.LIABILITY)
    with pytest.raises(AccountTypeMismatchError):
        chart.add("Expenses:Food:Snacks", AccountType.INCOME)


@pytest.mark.parametrize("name", ["", "Assets::Bank", " Assets"])
def test_invalid_names_are_rejected(chart: Chart, name: str) -> None:
    with pytest.raises(ValueError):
        chart.add(name, AccountType.ASSET)


def test_unknown_account(chart: Chart) -> None:
    with pytest.raises(UnknownAccountError) as info:
        chart.get("Assets:Savings")
    assert isinstance(info.value, KeyError)
    assert str(info.value) == "unknown account: Assets:Savings"


def test_descendants(chart: Chart) -> None:
    names = [account.name for account in chart.descendants("Assets:Bank")]
    assert names == ["Assets:Bank", "Assets:Bank:Checking"]
    assert len(chart.descendants("Assets")) == 4


def test_debit_normal_types() -> None:
    assert AccountType.ASSET.debit_normal
    assert AccountType.EXPENSE.debit_normal
    assert not AccountType.INCOME.debit_normal
    assert not AccountType.LIABILITY.debit_normal
