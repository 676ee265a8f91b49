"""The watched config file: valid changes applied, invalid ones refused with the bad path logged."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import yaml
from picker_builders import MODELS, NOW, config, pod, snapshot
from prometheus_client import CollectorRegistry

from pointsman_picker.reload import ConfigWatcher
from pointsman_picker.server import create_app, load_checked
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.config import PointsmanConfig, load_config


def write(path: Path, doc: object, stamp: int) -> None:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    os.utime(path, ns=(stamp, stamp))  # distinct mtimes, however fast the test writes


def watcher(path: Path) -> tuple[ConfigWatcher, list[PointsmanConfig]]:
    applied: list[PointsmanConfig] = []
    return ConfigWatcher(path, lambda p: (load_config(p, environ={}), []), applied.append), applied


def test_a_valid_change_is_applied_once(tmp_path):
    path = tmp_path / "pointsman.yaml"
    write(path, {"models": [{"modelName": "a"}]}, 1_000)
    watch, applied = watcher(path)
    assert not watch.check()  # unchanged since the start
    write(path, {"models": [{"modelName": "b"}]}, 2_000)
    assert watch.check()
    assert not watch.check()
    assert [m.model_name for m in applied[0].models] == ["b"]


def test_an_invalid_change_is_refused_naming_the_bad_path(tmp_path, caplog):
    path = tmp_path / "pointsman.yaml"
    write(path, {"models": [{"modelName": "a"}]}, 1_000)
    watch, applied = watcher(path)
    write(path, {"models": [{"modelName": "a", "criticality": "High"}]}, 2_000)
    with caplog.at_level(logging.ERROR, logger="pointsman_picker.reload"):
        assert not watch.check()
    assert applied == []
    assert "models[0].criticality" in caplog.text
    assert "running config stays" in caplog.text


def test_a_missing_file_is_not_a_change(tmp_path):
    path = tmp_path / "pointsman.yaml"
    write(path, {}, 1_000)
    watch, applied = watcher(path)
    path.unlink()  # e.g. mid-way through a ConfigMap's symlink swap
    assert not watch.check()
    assert applied == []


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
    assert app.director.route(b'{"model":"new-model"}').endpoint == "10.0.0.1:8000"
    assert app.service.settings.explain_header == "x-why"
    assert "picker.listen changed" in caplog.text


def test_a_change_whose_profile_does_not_build_is_refused(tmp_path, caplog):
    path = tmp_path / "pointsman.yaml"
    write(path, {}, 1_000)
    applied: list[PointsmanConfig] = []
    watch = ConfigWatcher(path, load_checked, applied.append)
    write(path, {"picker": {"profile": "missing"}}, 2_000)
    with caplog.at_level(logging.ERROR, logger="pointsman_picker.reload"):
        assert not watch.check()
    assert applied == []
    assert "picker.profile" in caplog.text
