"""Streaming detokenization: the text released token by token is the whole output's text,
held back through split multi-byte characters and possible stop strings, through the
tokenizers backend or the transformers wrapper alike."""

import pytest

from verispec.detokenize import TextStream
from verispec.models import resolve, tokenizer_for

TEXT = "Grüße aus Köln: 東京 → 🙂🙂 and <|im_end|> then plain words, ok?\n  indented ½"


class WrapperOnly:
    """The embedded tokenizer seen without its backend: the wrapper's ``decode`` only."""

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_for(resolve(None))


def streamed(tokenizer, ids, stop=()):
    stream = TextStream(tokenizer, stop)
    pieces, stopped = [], False
    for token in ids:
        stopped = stream.add(token)
        pieces.append(stream.take(final=stopped))
        if stopped:
            break
    pieces.append(stream.take(final=True))
    return pieces, stopped


def test_pieces_join_to_the_texts_decode_through_either_path(tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    whole = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert "\ufffd" not in whole and "<|im_end|>" not in whole  # a special token is skipped
    fast = TextStream(tokenizer)
    assert fast._backend is not None
    for source in (tokenizer, WrapperOnly(tokenizer)):
        pieces, _ = streamed(source, ids)
        assert "".join(pieces) == whole
        assert all("\ufffd" not in piece for piece in pieces)  # no half character released
    # Byte-level pieces of one emoji: nothing is released until the character is whole.
    emoji = tokenizer("🙂")["input_ids"]
    assert len(emoji) > 1
    stream = TextStream(tokenizer)
    for token in emoji[:-1]:
        stream.add(token)
        assert stream.take() == ""
    stream.add(emoji[-1])
    assert stream.take(final=True) == "🙂"


def test_a_stop_string_never_reaches_the_client_through_either_path(tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    for source in (tokenizer, WrapperOnly(tokenizer)):
        pieces, stopped = streamed(source, ids, stop=["Köln"])
        assert stopped and "".join(pieces) == "Grüße aus "
