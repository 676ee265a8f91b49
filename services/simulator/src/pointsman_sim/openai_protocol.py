"""The OpenAI-compatible request and response shapes vLLM serves, as pure functions over dicts."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import cycle, islice

from pointsman_sim.prefix import tokenize

DEFAULT_MAX_TOKENS = 16

_FILLER = (
    "the", "model", "serves", "this", "token", "from", "a", "simulated", "batch", "of",
    "requests", "on", "one", "pod", "while", "others", "wait",
)  # fmt: skip


class InvalidRequest(ValueError):
    """The request body is not a request this server understands (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """What the simulator needs from a completion or chat request."""

    model: str
    prompt: tuple[int, ...]
    """The prompt's token ids: the stand-in tokenizer's (``prefix.tokenize``), or the ids sent."""
    max_tokens: int
    stream: bool
    include_usage: bool

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)


def parse_completion(body: object) -> GenerationCall:
    fields = _object(body)
    prompt = fields.get("prompt")
    # One prompt: a string, token ids, or a list holding one of those. Batches are not simulated.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens = tokenize(prompt)
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        tokens = tuple(prompt)
    else:
        raise InvalidRequest("prompt must be a string or a list of token ids (one prompt)", "prompt")
    return _call(fields, tokens, fields.get("max_tokens"))


def parse_chat(body: object) -> GenerationCall:
    fields = _object(body)
    messages = fields.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages must be a non-empty list of message objects", "messages")
    # The messages' texts one after the other stand for the chat template's rendering: a conversation
    # that grows keeps its earlier turns as the prefix of its prompt.
    text = "".join(_content_text(m.get("content")) for m in messages)
    max_tokens = fields.get("max_completion_tokens", fields.get("max_tokens"))
    return _call(fields, tokenize(text), max_tokens)


def _object(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise InvalidRequest("model must be a string", "model")
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _call(fields: dict[str, object], prompt: tuple[int, ...], max_tokens: object) -> GenerationCall:
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be a boolean", "stream")
    options = fields.get("stream_options")
    return GenerationCall(
        model=str(fields["model"]),
        prompt=prompt,
        max_tokens=_max_tokens(max_tokens),
        stream=stream,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
    )


def _max_tokens(value: object) -> int:
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"max_tokens must be a positive integer, got {value!r}", "max_tokens")
    return value


def filler_text(start: int, count: int) -> str:
    """Words ``start .. start+count-1`` of an endless filler text, one word per token."""
    return "".join(" " + word for word in islice(cycle(_FILLER), start, start + count))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def error_body(message: str, error_type: str, code: int, param: str | None = None) -> dict[str, object]:
    """vLLM's error shape, e.g. ``NotFoundError`` with code 404."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class TextCompletion:
    """Responses of ``/v1/completions``."""

    OBJECT = "text_completion"

    def __init__(self, response_id: str, model: str, created: int) -> None:
        self._head: dict[str, object] = {
            "id": response_id,
            "object": self.OBJECT,
            "created": created,
            "model": model,
        }

    def opening_chunks(self) -> list[dict[str, object]]:
        return []

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, object]:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        return {**self._head, "choices": [choice]}

    def body(self, text: str, finish_reason: str, usage: dict[str, object]) -> dict[str, object]:
        return {**self.chunk(text, finish_reason), "usage": usage}

    def usage_chunk(self, usage: dict[str, object]) -> dict[str, object]:
        return {**self._head, "choices": [], "usage": usage}


class ChatCompletion:
    """Responses of ``/v1/chat/completions``."""

    def __init__(self, response_id: str, model: str, created: int) -> None:
        self._head: dict[str, object] = {"id": response_id, "created": created, "model": model}

    def opening_chunks(self) -> list[dict[str, object]]:
        return [self._chunk({"role": "assistant", "content": ""}, None)]

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, object]:
        return self._chunk({"content": text}, finish_reason)

    def _chunk(self, delta: dict[str, object], finish_reason: str | None) -> dict[str, object]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head, "object": "chat.completion.chunk", "choices": [choice]}

    def body(self, text: str, finish_reason: str, usage: dict[str, object]) -> dict[str, object]:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        return {**self._head, "object": "chat.completion", "choices": [choice], "usage": usage}

    def usage_chunk(self, usage: dict[str, object]) -> dict[str, object]:
        return {**self._head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
