"""``pointsman-collector``: argument and config errors, and the real process: its exit codes and SIGTERM."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import pytest
from collector_process import CONSOLE_SCRIPT, running_collector, start_collector

from pointsman_collector.__main__ import main
from pointsman_devstack.ports import free_port


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pointsman.yaml"
    path.write_text(text)
    return path


def test_config_is_required(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("POINTSMAN_CONFIG", raising=False)
    with pytest.raises(SystemExit) as excinfo:
        main([])
    assert excinfo.value.code == 2
    assert "--config is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read"),
        ("collector:\n  interval: fast\n", "collector.interval"),
        ("pool:\n  endpoints: ['10.0.0.1:8000', '10.0.0.1:8000']\n", "pool.endpoints[1]"),
    ],
    ids=["missing file", "bad duration", "duplicate endpoint"],
)
def test_a_bad_config_exits_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, message: str
) -> None:
    path = tmp_path / "absent.yaml" if text is None else write_config(tmp_path, text)
    assert main(["--config", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_the_config_path_may_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POINTSMAN_CONFIG", str(tmp_path / "absent.yaml"))
    assert main([]) == 2
    assert "absent.yaml" in capsys.readouterr().err


async def test_the_console_script_serves_until_sigterm_then_exits_0(
    tmp_path: Path, redis_url: str, pod_server, fixture_page
) -> None:
    # A process for what only a process shows: the installed command, SIGTERM, the exit code and the
    # log to the end. What it serves is tested in-process (test_collector_assembly.py).
    pod = await pod_server(fixture_page("vllm-v0-lora"))
    port = free_port()
    config = write_config(
        tmp_path,
        f"pool:\n  name: cli\n  endpoints: ['{pod.address}']\n"
        f"redis:\n  url: {redis_url}\ncollector:\n  listen: 127.0.0.1:{port}\n",
    )
    async with (
        running_collector(config, CONSOLE_SCRIPT) as run,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        # A bound for a hung start, not a speed check: a loaded CI machine imports slowly.
        async with asyncio.timeout(60):
            while True:
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        body = (await client.get("/v1/pool")).json()
        assert body["pool"] == "cli"
        assert [(p["address"], p["healthy"], p["waiting"]) for p in body["pods"]] == [(pod.address, True, 3)]
    log = run.log
    assert run.process.returncode == 0, log
    assert "Traceback" not in log
    assert "shutting down" in log
    assert log.rstrip().endswith("stopped")


async def test_a_taken_port_exits_1(tmp_path: Path, redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path, f"redis:\n  url: {redis_url}\ncollector:\n  listen: 127.0.0.1:{port}\n"
        )
        process = await start_collector(config)
        async with asyncio.timeout(60):  # a hung start's bound, not a speed check
            _, stderr = await process.communicate()
    assert process.returncode == 1
    assert "cannot listen on" in stderr.decode()
