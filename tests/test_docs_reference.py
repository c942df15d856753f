"""The recipe reference in docs/ covers every recipe field and matches the schema."""

from pathlib import Path

from slurmrl.recipe.reference import field_paths, reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "recipe-reference.md"


def test_every_field_is_documented():
    text = DOC.read_text()
    missing = [path for path, _, _ in field_paths() if f"`{path}`" not in text]
    assert not missing, f"fields missing from {DOC.name}: {missing}; run python -m slurmrl.recipe.reference"


def test_reference_is_current():
    assert DOC.read_text() == reference(), "regenerate: python -m slurmrl.recipe.reference > docs/recipe-reference.md"


def test_every_field_has_a_description():
    assert [p for p, f, _ in field_paths() if not f.description] == []
