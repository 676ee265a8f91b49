"""The watched config file: valid changes applied, invalid ones refused with the bad path logged."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from pathlib import Path

import pytest
import yaml
from picker_builders import MODELS, NOW, config, ctx, pod, snapshot
from prometheus_client import CollectorRegistry

from pointsman_picker.reload import ConfigWatcher
from pointsman_picker.server import create_app, load_checked
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.config import PointsmanConfig, load_config
from pointsman_testkit import eventually


def write(path: Path, doc: object, stamp: int) -> None:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    os.utime(path, ns=(stamp, stamp))  # distinct mtimes, however fast the test writes


def watcher(path: Path) -> tuple[ConfigWatcher, list[PointsmanConfig], list[str]]:
    applied: list[PointsmanConfig] = []
    results: list[str] = []
    watch = ConfigWatcher(
        path, lambda p: (load_config(p, environ={}), []), applied.append, on_result=results.append
    )
    return watch, applied, results


def settled(watch: ConfigWatcher) -> bool:
    """Two looks, as two intervals: the first sees the change, the second finds it held still."""
    assert not watch.check()
    return watch.check()


def test_a_valid_change_is_applied_once_it_holds_still(tmp_path):
    path = tmp_path / "pointsman.yaml"
    write(path, {"models": [{"modelName": "a"}]}, 1_000)
    watch, applied, results = watcher(path)
    assert not watch.check()  # unchanged since the start
    write(path, {"models": [{"modelName": "b"}]}, 2_000)
    assert settled(watch)
    assert not watch.check()
    assert [m.model_name for m in applied[0].models] == ["b"]
    assert results == ["applied"]


def test_a_file_still_being_written_is_not_read(tmp_path):
    path = tmp_path / "pointsman.yaml"
    write(path, {"models": [{"modelName": "a"}]}, 1_000)
    watch, applied, _ = watcher(path)
    path.write_bytes(b"models:\n  - modelName: b\n    criticality: Crit")  # the writer's first part
    os.utime(path, ns=(2_000, 2_000))
    assert not watch.check()
    write(path, {"models": [{"modelName": "b", "criticality": "Critical"}]}, 3_000)  # ... and the rest
    assert not watch.check()  # changed again since the last look: still settling
    assert watch.check()
    assert [m.criticality for m in applied[0].models] == ["Critical"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "the file is empty"),
        (b"# only a comment\n", "the file is empty"),
        (b"models:\n  - modelName: caf\xe9\n", "not UTF-8: byte 26 is 0xe9"),
        (b"models: [\n", "not valid YAML"),
        (b"- a list\n", "must be a mapping"),
        (b"models:\n  - {modelName: a, criticality: High}\n", "models[0].criticality"),
    ],
    ids=["empty", "comment-only", "not-utf8", "not-yaml", "not-a-mapping", "invalid-field"],
)
def test_a_bad_file_is_refused_counted_and_the_next_good_one_still_applies(tmp_path, caplog, content, reason):
    path = tmp_path / "pointsman.yaml"
    write(path, {"models": [{"modelName": "a"}]}, 1_000)
    watch, applied, results = watcher(path)
    path.write_bytes(content)
    os.utime(path, ns=(2_000, 2_000))
    with caplog.at_level(logging.ERROR, logger="pointsman_picker.reload"):
        assert not settled(watch)
    assert applied == []
    assert results == ["refused"]
    assert reason in caplog.text
    assert "running config stays" in caplog.text
    write(path, {"models": [{"modelName": "b"}]}, 3_000)
    assert settled(watch)
    assert results == ["refused", "applied"]


def test_a_missing_file_is_not_a_change(tmp_path):
    path = tmp_path / "pointsman.yaml"
    write(path, {}, 1_000)
    watch, applied, results = watcher(path)
    path.unlink()  # e.g. mid-way through a ConfigMap's symlink swap
    assert not watch.check()
    assert not watch.check()
    assert applied == []
    assert results == []


async def test_the_watch_outlives_a_loader_that_raises(tmp_path, caplog):
    path = tmp_path / "pointsman.yaml"
    write(path, {}, 1_000)
    calls: list[Path] = []

    def load(p: Path) -> tuple[PointsmanConfig, list[str]]:
        calls.append(p)
        if len(calls) == 1:
            raise KeyError("a bug")
        return load_config(p, environ={}), []

    applied: list[PointsmanConfig] = []
    watch = ConfigWatcher(path, load, applied.append, interval=0.01)
    task = asyncio.create_task(watch.run())
    try:
        write(path, {"models": [{"modelName": "a"}]}, 2_000)
        await eventually(lambda: len(calls) == 1)
        write(path, {"models": [{"modelName": "b"}]}, 3_000)
        await eventually(lambda: len(applied) == 1)
    finally:
        task.cancel()
    assert [m.model_name for m in applied[0].models] == ["b"]
    assert "cannot be loaded" in caplog.text


def test_the_app_routes_with_the_new_models_and_warns_about_restart_only_fields(caplog):
    app = create_app(
        config(),
        source=StaticSnapshotSource(snapshot(pod(address="10.0.0.1:8000"))),
        registry=CollectorRegistry(),
        rng=random.Random(0),
        clock=lambda: NOW,
    )
    renamed = [*MODELS, {"modelName": "new-model", "criticality": "Critical"}]
    with caplog.at_level(logging.WARNING, logger="pointsman_picker.server"):
        app.reconfigure(config(models=renamed, picker={"explainHeader": "X-Why", "listen": "0.0.0.0:9999"}))
    assert app.director.route(ctx(b'{"model":"new-model"}')).endpoint == "10.0.0.1:8000"
    assert app.service.settings.explain_header == "x-why"
    assert "picker.listen changed" in caplog.text


def test_a_change_whose_profile_does_not_build_is_refused(tmp_path, caplog):
    path = tmp_path / "pointsman.yaml"
    write(path, {}, 1_000)
    applied: list[PointsmanConfig] = []
    watch = ConfigWatcher(path, load_checked, applied.append)
    write(path, {"picker": {"profile": "missing"}}, 2_000)
    with caplog.at_level(logging.ERROR, logger="pointsman_picker.reload"):
        assert not settled(watch)
    assert applied == []
    assert "picker.profile" in caplog.text
