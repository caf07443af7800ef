"""docs/schema.md is the schema as code states it: regenerated here, it must not differ."""

from __future__ import annotations

from pathlib import Path

from pipeline.schema import render_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"


def test_the_schema_doc_is_what_the_schema_generates() -> None:
    # `make schema-doc` writes `python -m pipeline.schema`, which prints render_markdown().
    assert DOC.read_text() == render_markdown(), "docs/schema.md is stale: run `make schema-doc`"
