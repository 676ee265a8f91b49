"""What plugins read of a request's prompt."""

from __future__ import annotations

import pytest

from pointsman_picker.scheduling.prompt import estimate_prompt_tokens


@pytest.mark.parametrize(
    ("doc", "tokens"),
    [
        ({"prompt": "x" * 400}, 100),
        ({"prompt": ["x" * 40, "y" * 40, 7]}, 20),
        ({"messages": [{"role": "user", "content": "x" * 80}, {"role": "system", "content": "y" * 20}]}, 25),
        (
            {"messages": [{"content": [{"type": "text", "text": "x" * 40}, {"type": "image_url"}]}, "junk"]},
            10,
        ),
        ({"model": "m"}, 0),
        ({"prompt": 5, "messages": "no"}, 0),
    ],
)
def test_estimate_prompt_tokens(doc, tokens):
    assert estimate_prompt_tokens(doc) == tokens
