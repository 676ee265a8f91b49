"""The picker's config file, changed while the stack serves: a valid change is picked up without
dropping an open stream; an invalid one is refused with a log line naming the bad path."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import yaml
from integration_kit import Pool, completion

from pointsman_devstack.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture
def config_doc(stack: Stack) -> Iterator[dict]:
    """The stack's config as a document; the file is put back as it was after the test."""
    original = stack.config_file.read_text(encoding="utf-8")
    try:
        yield yaml.safe_load(original)
    finally:
        reloads = picker_log(stack).count("config reloaded")
        stack.config_file.write_text(original, encoding="utf-8")
        # The original config back in force before the next test (the watcher polls once a second).
        wait_until(lambda: picker_log(stack).count("config reloaded") > reloads)


def picker_log(stack: Stack) -> str:
    return (stack.run_dir / "picker.log").read_text(encoding="utf-8")


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s")
        time.sleep(0.1)


def test_a_new_model_is_served_after_a_reload_and_an_open_stream_survives(
    gateway: httpx.Client, stack: Stack, pool: Pool, config_doc: dict
) -> None:
    assert gateway.post("/v1/completions", json=completion("reloaded-model")).status_code == 404
    request = completion("sql-lora", max_tokens=64, stream=True)
    with gateway.stream("POST", "/v1/completions", json=request) as open_stream:
        assert open_stream.status_code == 200
        config_doc["models"].append(
            {"modelName": "reloaded-model", "criticality": "Critical", "targetModels": [{"name": "sql-lora"}]}
        )
        stack.config_file.write_text(yaml.safe_dump(config_doc), encoding="utf-8")

        def served() -> bool:
            return gateway.post("/v1/completions", json=completion("reloaded-model")).status_code == 200

        wait_until(served)
        lines = [line for line in open_stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"


def test_an_invalid_change_is_refused_and_the_running_config_stays(
    gateway: httpx.Client, stack: Stack, pool: Pool, config_doc: dict
) -> None:
    config_doc["scheduling"]["kvCacheThreshold"] = 7
    stack.config_file.write_text(yaml.safe_dump(config_doc), encoding="utf-8")
    wait_until(lambda: "scheduling.kvCacheThreshold" in picker_log(stack))
    assert "config change refused, the running config stays" in picker_log(stack)
    assert gateway.post("/v1/completions", json=completion("sql-lora")).status_code == 200


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "the file is empty"), (b"models:\n  - modelName: caf\xe9\n", "not UTF-8")],
    ids=["empty", "not-utf8"],
)
def test_an_empty_or_undecodable_file_is_refused_counted_and_the_next_change_applies(
    gateway: httpx.Client, stack: Stack, pool: Pool, config_doc: dict, content: bytes, reason: str
) -> None:
    refused_before = refusals(stack)
    stack.config_file.write_bytes(content)  # a truncating editor, `> file`, a bad encoding
    wait_until(lambda: reason in picker_log(stack))
    wait_until(lambda: refusals(stack) == refused_before + 1)
    # The running config stays: its models are still served, not 404 (or passed through) as "no models".
    response = gateway.post("/v1/completions", json=completion("sql-lora-sheddable"))
    assert response.status_code == 200
    # ... and reloading still works.
    reloads = picker_log(stack).count("config reloaded")
    stack.config_file.write_text(yaml.safe_dump(config_doc), encoding="utf-8")
    wait_until(lambda: picker_log(stack).count("config reloaded") > reloads)


def refusals(stack: Stack) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.ports.picker_metrics}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith('pointsman_picker_config_reloads_total{result="refused"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
