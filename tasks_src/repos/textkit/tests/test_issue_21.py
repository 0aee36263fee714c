from textkit import slugify, unique_slug


def test_slugify_transliterates_accented_letters() -> None:
    assert slugify("Crème Brûlée") == "creme-brulee"
    assert slugify("São Paulo, Açores") == "sao-paulo-acores"
    assert slugify("Ångström", sep="_") == "angstrom"


def test_unique_slug_with_accented_title() -> None:
    assert unique_slug("Café", {"cafe"}) == "cafe-2"
