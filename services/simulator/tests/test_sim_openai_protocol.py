from __future__ import annotations

import pytest

from pointsman_sim.openai_protocol import InvalidRequest, filler_text, parse_chat, parse_completion

MODEL = "m"


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        pytest.param("x" * 40, 10, id="string"),
        pytest.param("", 1, id="empty-string-is-one-token"),
        pytest.param([1, 2, 3], 3, id="token-ids"),
        pytest.param(["x" * 8], 2, id="one-string-in-a-list"),
        pytest.param([[5, 6]], 2, id="one-token-list-in-a-list"),
    ],
)
def test_completion_prompt_tokens(prompt: object, tokens: int) -> None:
    assert parse_completion({"model": MODEL, "prompt": prompt}).prompt_tokens == tokens


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"model": MODEL, "prompt": ["a", "b"]}, id="batch"),
        pytest.param({"model": MODEL, "prompt": 3}, id="number"),
        pytest.param({"prompt": "a"}, id="no-model"),
        pytest.param({"model": MODEL, "prompt": "a", "max_tokens": True}, id="bool-max-tokens"),
        pytest.param({"model": MODEL, "prompt": "a", "stream": "yes"}, id="stream-not-bool"),
        pytest.param({"model": MODEL, "messages": []}, id="chat-no-messages"),
    ],
)
def test_rejects(body: dict[str, object]) -> None:
    parse = parse_chat if "messages" in body else parse_completion
    with pytest.raises(InvalidRequest):
        parse(body)


def test_chat_counts_text_of_every_message_and_part() -> None:
    messages = [
        {"role": "system", "content": "s" * 20},
        {"role": "user", "content": [{"type": "text", "text": "u" * 20}, {"type": "image_url"}]},
    ]
    call = parse_chat({"model": MODEL, "messages": messages, "max_tokens": 7, "stream": True})
    assert (call.prompt_tokens, call.max_tokens, call.stream, call.include_usage) == (10, 7, True, False)


def test_filler_text_continues_where_it_left_off() -> None:
    assert filler_text(0, 2) + filler_text(2, 3) == filler_text(0, 5)
    assert len(filler_text(0, 100).split()) == 100
