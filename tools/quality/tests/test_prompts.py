"""The live requests' prompts: four characters a token."""

from __future__ import annotations

from pointsman_quality.prompts import prompt_text


def test_prompts_are_four_characters_a_token() -> None:
    assert prompt_text(3) == " 000 001 002"
    assert len(prompt_text(250, offset=990)) == 1000
