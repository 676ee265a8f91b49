from __future__ import annotations

import pytest

from pointsman_sim.calibration import CHECKS, Measurement, main, table


@pytest.mark.parametrize("number", sorted(CHECKS))
def test_profile_reproduces_published_figure(number: int) -> None:
    measurements = CHECKS[number]()
    assert measurements
    failed = [m for m in measurements if not m.passed]
    assert not failed, table(failed)


def test_table_marks_failures_and_shows_holds_as_words() -> None:
    text = table(
        [
            Measurement(1, "itl", 9.5, "7.2 ±25%", 5.4, 9.0),
            Measurement(10, "slots", 1.0, "holds", 1.0, 1.0),
        ]
    )
    rows = text.splitlines()
    assert rows[1].split()[-1] == "FAIL"
    assert rows[2].split()[-3:] == ["yes", "holds", "ok"]


def test_main_prints_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main() == 0
    *rows, _, summary = capsys.readouterr().out.splitlines()
    assert {int(row.split()[0]) for row in rows[1:]} == set(CHECKS)
    assert summary.endswith("within the published bounds")
