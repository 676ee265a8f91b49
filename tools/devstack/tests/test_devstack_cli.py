from __future__ import annotations

from pathlib import Path

import pytest

from pointsman_devstack.__main__ import main


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param(None, "cannot read", id="missing"),
        pytest.param(
            "pool: {endpoints: ['10.0.0.1:8001']}\nmodels: [{modelName: m}]\n", "not loopback", id="remote"
        ),
        pytest.param("pool: {endpoints: ['127.0.0.1:8001']}\n", "no base model", id="no-models"),
        pytest.param("pool: {targetPort: 0}\n", "pool.targetPort", id="invalid"),
    ],
)
def test_a_config_the_stack_cannot_run_exits_2_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str | None, message: str
) -> None:
    path = tmp_path / "config.yaml"
    if config is not None:
        path.write_text(config, encoding="utf-8")
    run_dir = tmp_path / "run"
    assert main(["--config", str(path), "--run-dir", str(run_dir)]) == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


def test_no_picker_is_refused_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("pool: {endpoints: ['127.0.0.1:8001']}\nmodels: [{modelName: m}]\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    assert main(["--config", str(path), "--run-dir", str(run_dir), "--pickers", "0"]) == 2
    assert "--pickers" in capsys.readouterr().err
    assert not run_dir.exists()
