"""Report pages rendered thinly from a report's JSON: a Markdown template under
``experiments/templates/`` with ``$name`` fields (``string.Template``), tables built from rows
of already-formatted cells, and a section of notes written by hand that re-rendering keeps.

The notes are the text between ``NOTES_BEGIN`` and ``NOTES_END`` in the page as it is on disk:
``write_page`` reads them back and renders them unchanged, so the interpretation of a report's
figures is edited in the page itself and no sentence of it is generated from the numbers.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"
NOTES_BEGIN = "<!-- notes: written by hand; re-rendering the page keeps them as they are -->"
NOTES_END = "<!-- end of notes -->"
NO_NOTES = "(No notes yet: write them here, between the markers.)"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table of ``headers`` and ``rows`` (cells rendered with ``str``)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pct(x: float, digits: int = 1) -> str:
    """A fraction as a percentage (``n/a`` where it is not finite)."""
    return "n/a" if not math.isfinite(x) else f"{100 * x:.{digits}f}%"


def seed_range(seeds: Sequence[int]) -> str:
    """Seeds as ``0-9`` where they run consecutively, else listed."""
    s = sorted(seeds)
    if len(s) > 1 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ", ".join(str(v) for v in s)


def seeds_by_requests(seeds: Iterable[int], requests: Iterable[int]) -> str:
    """Runs' seeds × their requests per run, in words: ``3 seeds (0-2) × 4000 requests per
    run``, ``1 seed (0) × 300-900 requests per run``."""
    s, n = set(seeds), sorted(set(requests))
    count = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    return f"{len(s)} seed{'s' if len(s) > 1 else ''} ({seed_range(s)}) × {count} requests per run"


def slo_text(ttft_s: float, itl_s: float) -> str:
    """The lifetime-goodput SLO in words."""
    return f"TTFT ≤ {ttft_s:g} s and every ITL ≤ {1e3 * itl_s:g} ms"


def kept_notes(page: Path) -> str:
    """The notes of ``page`` as it is on disk (``NO_NOTES`` for a new page or one without the
    markers)."""
    if not page.exists():
        return NO_NOTES
    text = page.read_text()
    start, end = text.find(NOTES_BEGIN), text.find(NOTES_END)
    if start < 0 or end < start:
        return NO_NOTES
    return text[start + len(NOTES_BEGIN) : end].strip("\n") or NO_NOTES


def render(template: str, fields: Mapping[str, str], notes: str) -> str:
    """``templates/<template>`` with its ``$name`` fields filled and ``$notes`` replaced by
    ``notes`` between the markers.

    Raises:
        ValueError: the template names a field that ``fields`` lacks.
    """
    text = (TEMPLATES / template).read_text()
    block = f"{NOTES_BEGIN}\n{notes}\n{NOTES_END}"
    try:
        return string.Template(text).substitute({**fields, "notes": block})
    except KeyError as e:
        raise ValueError(f"template {template} names field {e.args[0]!r}, not given") from None


def write_page(path: Path, template: str, fields: Mapping[str, str]) -> str:
    """Render ``template`` into ``path``, keeping the notes already there; returns the page."""
    text = render(template, fields, kept_notes(path))
    path.write_text(text)
    return text
