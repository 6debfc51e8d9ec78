"""experiments/report_template.py: pages filled from fields, tables from rows, and the notes
written by hand kept across renders."""

from __future__ import annotations

import pytest

import experiments.report_template as rt


@pytest.fixture()
def templates(tmp_path, monkeypatch):
    (tmp_path / "t.md").write_text("# $title\n\n$notes\n\n$body\n")
    monkeypatch.setattr(rt, "TEMPLATES", tmp_path)
    return tmp_path


def test_a_table_has_its_header_rule_and_rows():
    assert rt.table(("a", "b"), [(1, "x"), (2.5, None)]) == (
        "| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | None |"
    )


def test_the_notes_written_by_hand_survive_a_new_render(templates, tmp_path):
    page = tmp_path / "out.md"
    first = rt.write_page(page, "t.md", {"title": "T", "body": "| 1 |"})
    assert rt.NO_NOTES in first and first.startswith("# T\n")
    page.write_text(page.read_text().replace(rt.NO_NOTES, "Written by hand:\n\n- 1.53x"))
    again = rt.write_page(page, "t.md", {"title": "T", "body": "| 2 |"})
    assert "Written by hand:\n\n- 1.53x\n" in again and "| 2 |" in again and "| 1 |" not in again
    assert again.count(rt.NOTES_BEGIN) == 1 and again.count(rt.NOTES_END) == 1


def test_a_page_without_markers_gets_the_placeholder(tmp_path):
    page = tmp_path / "old.md"
    page.write_text("an old generated page\n")
    assert rt.kept_notes(page) == rt.NO_NOTES
    assert rt.kept_notes(tmp_path / "absent.md") == rt.NO_NOTES


def test_a_field_the_template_names_but_not_given_is_named(templates, tmp_path):
    with pytest.raises(ValueError, match="field 'body'"):
        rt.render("t.md", {"title": "T"}, "notes")


def test_small_formatters():
    assert rt.pct(0.2794) == "27.9%" and rt.pct(float("nan")) == "n/a"
    assert rt.seed_range(range(10)) == "0-9" and rt.seed_range([0, 2]) == "0, 2"
    assert rt.slo_text(0.25, 0.01) == "TTFT ≤ 0.25 s and every ITL ≤ 10 ms"
    assert rt.seeds_by_requests([0, 1, 2], [4000]) == "3 seeds (0-2) × 4000 requests per run"
    assert rt.seeds_by_requests([0, 0], [300, 900]) == "1 seed (0) × 300-900 requests per run"
