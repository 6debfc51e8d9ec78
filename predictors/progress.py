"""What the learned predictor sees of a reply while it is generated: features of its first ``g``
tokens (``Request.output_token_ids[:g]``, the text a real engine has when it re-predicts).

Everything is read at token-id level. ``TokenClasses`` sorts the tokenizer's vocabulary once
(~0.2 s) into classes: newline-bearing tokens, code-fence pieces (the tokenizer may split a fence
as ``"``"`` + ``"`\\n"``), list markers, sentence ends, words of concluding phrases ("In
summary", "In conclusion", "I hope this helps", "Let me know", "feel free", "Good luck", "any
other questions", ...). ``ReplyProgress`` turns one reply's ids into cumulative counts and
"position of the last ..." arrays (numpy ``cumsum`` / ``maximum.accumulate``), so that the
features at any ``g`` are one row lookup.

No leakage by construction: every per-position indicator at position ``j`` looks only at tokens
``j - 2 .. j``, and the row for ``g`` reads positions ``< g`` only (``tests`` perturb the tokens
from ``g`` on and check nothing changes).
"""

from __future__ import annotations

import functools
import re

import numpy as np

TEXT_PROGRESS_FEATURES: tuple[str, ...] = (
    "log_newlines",
    "newline_rate",
    "log_paragraphs",
    "log_since_newline",
    "log_since_paragraph",
    "fences",
    "in_code",
    "log_since_fence",
    "log_items",
    "last_item_number",
    "log_since_item",
    "log_sentences",
    "log_since_sentence",
    "log_concluding",
    "log_since_concluding",
    "log_intro_colons",
    "log_since_intro_colon",
    "log_headings",
    "log_questions",
    "log_first_item",
    "log_tokens_per_item",
    "log_tokens_per_paragraph",
)

# concluding phrases: (word two back or None, previous word or None, this word), compared on
# the token's text stripped and lower-cased; a match marks the position of the last word
_CONCLUDING: tuple[tuple[str | None, str | None, str], ...] = (
    (None, None, "conclusion"),
    (None, "in", "summary"),
    (None, "to", "summarize"),
    (None, "to", "sum"),
    (None, None, "overall"),
    (None, "i", "hope"),
    (None, "hope", "this"),
    (None, "this", "helps"),
    ("let", "me", "know"),
    (None, "feel", "free"),
    (None, "good", "luck"),
    (None, "other", "questions"),
    (None, "further", "questions"),
    (None, "more", "questions"),
    (None, "any", "questions"),
    (None, "additional", "questions"),
    (None, "don't", "hesitate"),
    (None, "happy", "to"),
    (None, "best", "regards"),
    (None, None, "sincerely"),
    (None, "in", "short"),
    (None, None, "ultimately"),
    (None, "final", "thoughts"),
)
_DIGITS = re.compile(r"^\d{1,3}$")
_BULLETS = {"-", "*", "•", "+"}


class TokenClasses:
    """Per-vocabulary-id indicator arrays (module docstring). Build with ``for_tokenizer``."""

    def __init__(self, texts: list[str]) -> None:
        n = len(texts)
        low = [t.strip().lower() for t in texts]
        self.newlines = np.fromiter((t.count("\n") for t in texts), np.int32, n)
        self.paragraphs = np.fromiter((t.count("\n\n") for t in texts), np.int32, n)
        self.starts_nl = np.fromiter((t.startswith("\n") for t in texts), bool, n)
        self.ends_nl = np.fromiter((t.endswith("\n") for t in texts), bool, n)
        self.fence = np.fromiter(("```" in t for t in texts), bool, n)
        self.ends_2tick = np.fromiter((t.endswith("``") for t in texts), bool, n) & ~self.fence
        self.ends_1tick = np.fromiter(
            (t.endswith("`") and not t.endswith("``") for t in texts), bool, n
        )
        self.starts_1tick = np.fromiter((t.startswith("`") for t in texts), bool, n)
        self.starts_2tick = np.fromiter((t.startswith("``") for t in texts), bool, n)
        self.digits = np.fromiter((bool(_DIGITS.match(t)) for t in low), bool, n)
        self.number = np.asarray([int(t) if _DIGITS.match(t) else 0 for t in low], np.float64)
        self.bullet = np.fromiter((t in _BULLETS for t in low), bool, n)
        self.heading = np.fromiter((t.startswith("#") for t in low), bool, n)
        self.dot = np.fromiter((t in (".", ")") for t in texts), bool, n)  # "1." "1)"
        self.sentence = np.fromiter(
            (bool(t) and t[-1] in ".!?\u3002\uff01\uff1f" and not t[:-1].isdigit() for t in low),
            bool,
            n,
        )
        self.question = np.fromiter(("?" in t or "\uff1f" in t for t in texts), bool, n)
        self.colon = np.fromiter((t.endswith(":") or t.endswith("\uff1a") for t in low), bool, n)
        words = {w for pat in _CONCLUDING for w in pat if w is not None}
        word_id = {w: i + 1 for i, w in enumerate(sorted(words))}
        self.word = np.asarray([word_id.get(t, 0) for t in low], np.int16)
        self.patterns = tuple(
            (word_id[a] if a else 0, word_id[b] if b else 0, word_id[c]) for a, b, c in _CONCLUDING
        )

    @classmethod
    def for_tokenizer(cls, tokenizer) -> TokenClasses:  # noqa: ANN001
        return _classes(tokenizer)

    def progress(self, ids) -> ReplyProgress:  # noqa: ANN001
        return ReplyProgress(self, np.asarray(ids, dtype=np.int64))


@functools.lru_cache(maxsize=4)
def _classes(tokenizer) -> TokenClasses:  # noqa: ANN001
    n = len(getattr(tokenizer, "_mergeable_ranks", ())) or 151643
    special = getattr(tokenizer, "_special_tokens", {}) or {}
    top = max([n - 1, *special.values()]) + 1
    texts = [tokenizer.decode([i]) for i in range(n)] + [""] * (top - n)
    return TokenClasses(texts)


class ReplyProgress:
    """Cumulative counts over one reply's ids; ``at(g)`` gives the ``TEXT_PROGRESS_FEATURES``
    of ``ids[:g]`` (rows for many ``g`` at once)."""

    def __init__(self, c: TokenClasses, ids: np.ndarray) -> None:
        t = len(ids)
        ids = np.clip(ids, 0, len(c.newlines) - 1)
        prev = np.r_[False, c.ends_nl[ids][:-1]] if t else np.zeros(0, bool)
        prev_id = np.r_[-1, ids[:-1]] if t else ids
        ok1 = prev_id >= 0
        p1 = np.where(ok1, prev_id, 0)
        nl = c.newlines[ids]
        para = c.paragraphs[ids] + (prev & c.starts_nl[ids])
        fence = (
            c.fence[ids]
            | (ok1 & c.ends_2tick[p1] & c.starts_1tick[ids] & ~c.fence[ids])
            | (ok1 & c.ends_1tick[p1] & c.starts_2tick[ids])
        )
        line_start = prev | (np.arange(t) == 0)
        item = line_start & (c.digits[ids] | c.bullet[ids])
        number = np.where(line_start & c.digits[ids], c.number[ids], np.nan)
        heading = line_start & c.heading[ids]
        w0 = c.word[ids]
        w1 = np.r_[0, w0[:-1]] if t else w0
        w2 = np.r_[0, 0, w0[:-2]] if t > 1 else np.zeros(t, np.int16)
        conc = np.zeros(t, bool)
        for a, b, z in c.patterns:
            m = w0 == z
            if b:
                m &= w1 == b
            if a:
                m &= w2 == a
            conc |= m
        colon_nl = c.colon[prev_id.clip(0)] & ok1 & (nl > 0) & c.starts_nl[ids]
        colon_nl |= c.colon[ids] & c.ends_nl[ids]  # ":\n" in one token
        self.n = t
        self.cum = {
            "nl": _cum(nl),
            "para": _cum(para),
            "fence": _cum(fence),
            "item": _cum(item),
            "sent": _cum(c.sentence[ids]),
            "conc": _cum(conc),
            "colon": _cum(colon_nl),
            "head": _cum(heading),
            "q": _cum(c.question[ids]),
        }
        self.last = {
            "nl": _last(nl > 0),
            "para": _last(para > 0),
            "fence": _last(fence),
            "item": _last(item),
            "sent": _last(c.sentence[ids]),
            "conc": _last(conc),
            "colon": _last(colon_nl),
        }
        num = np.r_[np.nan, number]
        idx = np.where(np.isnan(num), 0, np.arange(t + 1))
        self.last_number = num[np.maximum.accumulate(idx)]  # by g: the last item number seen
        starts = np.flatnonzero(item)
        self.first_item = int(starts[0]) if len(starts) else -1  # position of the first item

    def at(self, g) -> np.ndarray:  # noqa: ANN001
        """Rows of ``TEXT_PROGRESS_FEATURES`` for ``ids[:g]`` at each ``g`` (clipped to the
        reply's length)."""
        g = np.clip(np.asarray(g, dtype=np.int64), 0, self.n)
        gf = g.astype(np.float64)
        cum, last = self.cum, self.last

        def since(name: str) -> np.ndarray:
            p = last[name][g]  # position of the last one before g, -1 if none
            return np.where(p >= 0, np.log1p(gf - 1 - p), np.nan)

        fences = cum["fence"][g]
        return np.column_stack(
            [
                np.log1p(cum["nl"][g]),
                cum["nl"][g] / np.maximum(gf, 1.0),
                np.log1p(cum["para"][g]),
                since("nl"),
                since("para"),
                fences,
                fences % 2,
                since("fence"),
                np.log1p(cum["item"][g]),
                self.last_number[g],
                since("item"),
                np.log1p(cum["sent"][g]),
                since("sent"),
                np.log1p(cum["conc"][g]),
                since("conc"),
                np.log1p(cum["colon"][g]),
                since("colon"),
                np.log1p(cum["head"][g]),
                np.log1p(cum["q"][g]),
                *self._list_pace(g, gf),
                np.log1p(gf / (cum["para"][g] + 1.0)),
            ]
        )

    def _list_pace(self, g: np.ndarray, gf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(log1p(position of the first list item), log1p(tokens per item since it))`` at
        each ``g``: NaN before the first item is seen; the pace also needs 2 items."""
        first = self.first_item
        seen = (first >= 0) & (g > first)
        items = self.cum["item"][g]
        pace = np.maximum(gf - first, 0.0) / np.maximum(items, 1.0)
        return (
            np.where(seen, np.log1p(max(first, 0)), np.nan),
            np.where(seen & (items >= 2), np.log1p(pace), np.nan),
        )


def _cum(x: np.ndarray) -> np.ndarray:
    """``out[g]`` = sum of ``x[:g]`` (length ``len(x) + 1``)."""
    out = np.zeros(len(x) + 1, dtype=np.float64)
    np.cumsum(x, out=out[1:])
    return out


def _last(x: np.ndarray) -> np.ndarray:
    """``out[g]`` = the last position ``j < g`` with ``x[j]``, -1 if none (length ``len + 1``)."""
    pos = np.where(x, np.arange(len(x)), -1)
    return np.r_[-1, np.maximum.accumulate(pos)] if len(x) else np.array([-1])


def progress_rows(
    classes: TokenClasses, outputs: list, rows: np.ndarray, g: np.ndarray
) -> np.ndarray:
    """``TEXT_PROGRESS_FEATURES`` for many ``(request index, g)`` points: ``outputs[i]`` is a
    request's output ids or None (its rows are NaN)."""
    out = np.full((len(rows), len(TEXT_PROGRESS_FEATURES)), np.nan)
    rows = np.asarray(rows)
    g = np.asarray(g)
    order = np.argsort(rows, kind="stable")
    bounds = np.flatnonzero(np.diff(rows[order])) + 1
    for sel in np.split(order, bounds):
        if not len(sel):
            continue
        ids = outputs[int(rows[sel[0]])]
        if ids is not None:
            out[sel] = classes.progress(ids).at(g[sel].astype(np.int64))
    return out
