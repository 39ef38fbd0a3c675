"""Incremental detokenisation: streamed pieces concatenate to the full decode, also for multi-byte
characters split across byte-level BPE tokens; stop strings are cut and never leak."""
import pytest

from tokenmill.engine.detokenizer import IncrementalDetokenizer

TEXTS = ["Hello, world! How are you?", "naïve café — déjà vu", "你好，世界。今天天气很好",
         "emoji 🙂🚀👩‍👩‍👧 mixed", "  leading spaces and\nnew lines\n\n", "code: def f(x):\n    return x**2"]


@pytest.mark.parametrize("text", TEXTS)
def test_stream_concatenates_to_full_text(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    prompt = tok.encode("Say:")
    ids = tok.encode(text)
    det = IncrementalDetokenizer(tok)
    st = det.start(prompt, [], True)
    pieces = [det.add_token(st, t) for t in ids]
    assert "".join(pieces) == tok.decode(ids) == st.text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_is_cut_and_held_back(smollm2_tokenizer):
    tok = smollm2_tokenizer
    det = IncrementalDetokenizer(tok)
    st = det.start(tok.encode("x"), ["STOP"], True)
    streamed = ""
    for t in tok.encode("alpha beta STOP gamma"):
        det.add_token(st, t)
        visible = det.visible_text(st, False, False)
        assert "STO" not in visible[len("alpha beta "):] or st.stop_hit
        streamed = visible
        if st.stop_hit:
            break
    assert st.stop_hit == "STOP" and streamed == "alpha beta "
    assert det.visible_text(st, True, True) == "alpha beta STOP"


def test_earliest_of_several_stops_wins(smollm2_tokenizer):
    tok = smollm2_tokenizer
    det = IncrementalDetokenizer(tok)
    st = det.start(tok.encode("x"), ["gamma", "beta"], True)
    for t in tok.encode("alpha beta gamma"):
        det.add_token(st, t)
        if st.stop_hit:
            break
    assert st.stop_hit == "beta" and st.text == "alpha "
