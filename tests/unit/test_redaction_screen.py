"""The one-pass screen of ``clean_text`` and ``_cannot_match`` (``redaction._screened``)
answers as the two passes it replaced: ``text.lower()`` searched for the needles, and the
text's digits as "0" with spaces and dashes deleted searched for 13 "0"s."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from replayq import redaction
from replayq.redaction import Redactor


def _two_passes(text: str, needles: tuple[str, ...], cards: bool) -> bool:
    lowered = text.lower()
    if any(needle in lowered for needle in needles):
        return False
    return not (
        cards
        and text.encode().translate(redaction._DIGIT_RUNS, b" -").find(redaction._CARD_RUN) != -1
    )


def test_needles_are_left_as_they_are() -> None:
    for needles in redaction._NEEDLES.values():
        for needle in needles:
            assert needle.encode().translate(redaction._SCREEN).decode() == needle
            assert "0" not in needle


_ALPHABET = st.sampled_from([*'0123456789 -_:/.aAbBeErRsScCiIzZ"{},', "bearer", "BASIC"])


@settings(max_examples=400)
@given(st.lists(_ALPHABET, max_size=60).map("".join), st.booleans())
@example("4111 1111 1111 1111", True)
@example("4111-1111-1111-1111", True)
@example("2024-01-01 12:00:00", True)
@example("0000000000000", True)
@example("             1", True)
@example("123456789012", True)
@example("Authorization: BeArEr abc", True)
@example("redis://:pw@host", False)
def test_screen_answers_as_the_two_passes(text: str, cards: bool) -> None:
    needles = tuple(n for found in redaction._NEEDLES.values() for n in found)
    assert redaction._screened_clean(text, needles, cards) == _two_passes(text, needles, cards)
    assert redaction._screened_clean(text, (), cards) == _two_passes(text, (), cards)


@settings(max_examples=200)
@given(st.lists(_ALPHABET, max_size=60).map("".join))
def test_clean_text_and_cannot_match_as_before(text: str) -> None:
    redactor = Redactor.build()
    needles = redactor._needles
    assert needles is not None
    assert redactor._cannot_match(text) == _two_passes(text, needles, redactor.cards)
    keyless = f'{{"k":"{text}"}}' if '"' not in text and "\\" not in text else '{"k":1}'
    assert redactor.clean_text(keyless, {"k"}) == _two_passes(keyless, needles, redactor.cards)
