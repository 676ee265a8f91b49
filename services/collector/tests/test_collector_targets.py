from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pointsman_collector.errors import DiscoveryError
from pointsman_collector.targets import FileTargets, Sources, parse_endpoints

STATIC = ("10.0.0.1:8000",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        ("10.0.0.2:9000\n10.0.0.3\n", ("10.0.0.2:9000", "10.0.0.3:8000")),
        ("# pods\n\n  10.0.0.2  # the first\n", ("10.0.0.2:8000",)),
        ("[fd00::1]:9000\n[fd00::2]\n", ("[fd00::1]:9000", "[fd00::2]:8000")),
        ("10.0.0.2\n10.0.0.2:8000\n", ("10.0.0.2:8000",)),
        ("pod-a.example:8000\r\n", ("pod-a.example:8000",)),
    ],
    ids=["empty", "default port", "comments and blanks", "ipv6", "duplicates", "crlf"],
)
def test_parse_endpoints(text: str, expected: tuple[str, ...]) -> None:
    assert parse_endpoints(text, 8000) == expected


@pytest.mark.parametrize("line", ["10.0.0.2:http", "fd00::1:9000", ":9000", "10.0.0.2:70000"])
def test_a_bad_line_is_named(line: str) -> None:
    with pytest.raises(DiscoveryError, match="line 2"):
        parse_endpoints(f"10.0.0.1\n{line}\n", 8000)


def write(path: Path, text: str) -> None:
    # Replace, as editors and ConfigMap updates do; the new inode marks the change even within one mtime tick.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def targets_for(path: Path) -> FileTargets:
    return FileTargets(path, static=STATIC, default_port=8000, on_change=lambda endpoints: None)


def test_refresh_follows_the_file_and_keeps_the_last_good_set(tmp_path: Path) -> None:
    path = tmp_path / "endpoints"
    write(path, "10.0.0.2\n")
    targets = targets_for(path)
    assert targets.refresh()
    assert targets.endpoints == ("10.0.0.1:8000", "10.0.0.2:8000")
    assert not targets.refresh()  # unchanged file

    write(path, "10.0.0.2\n10.0.0.3\n")
    assert targets.refresh()
    assert targets.endpoints == ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")

    write(path, "10.0.0.2\n10.0.0.3:port\n")  # a bad edit: keep what worked
    assert not targets.refresh()
    assert targets.endpoints == ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")

    path.unlink()  # gone: keep what worked
    assert not targets.refresh()
    assert targets.endpoints == ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")

    write(path, "# nothing left\n")
    assert targets.refresh()
    assert targets.endpoints == STATIC


def test_a_missing_file_at_start_leaves_the_config_endpoints(tmp_path: Path) -> None:
    targets = targets_for(tmp_path / "absent")
    assert not targets.refresh()
    assert targets.endpoints == STATIC


async def test_watch_reports_each_change(tmp_path: Path) -> None:
    path = tmp_path / "endpoints"
    write(path, "10.0.0.2\n")
    changes: list[tuple[str, ...]] = []
    changed = asyncio.Event()
    targets = FileTargets(
        path,
        static=STATIC,
        default_port=8000,
        on_change=lambda endpoints: (changes.append(endpoints), changed.set()),
        poll=0.01,
    )
    targets.refresh()
    watcher = asyncio.create_task(targets.watch())
    try:
        write(path, "10.0.0.3\n")
        async with asyncio.timeout(3.0):
            await changed.wait()
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    assert changes == [("10.0.0.1:8000", "10.0.0.3:8000")]


def test_sources_push_their_union_once_connected() -> None:
    pushed: list[tuple[str, ...]] = []
    sources = Sources()
    sources.update("config", ("a:1", "b:1"))
    sources.update("file", ("b:1", "c:1"))
    assert pushed == []
    sources.connect(pushed.append)
    sources.update("kubernetes", ("d:1",))
    sources.update("file", ())
    assert pushed == [("a:1", "b:1", "c:1"), ("a:1", "b:1", "c:1", "d:1"), ("a:1", "b:1", "d:1")]
