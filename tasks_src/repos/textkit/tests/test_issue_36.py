from textkit import closest


def test_closest_ignores_case_by_default() -> None:
    assert closest("PYTHON", ["java", "python"], max_distance=2) == "python"
    assert closest("Colour", ["color", "COLUMN"]) == "color"


def test_closest_can_be_case_sensitive() -> None:
    assert closest("PYTHON", ["java", "python"], max_distance=2, case_sensitive=True) is None
