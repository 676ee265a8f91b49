"""The dispatch pace: a token bucket of ``burst`` slots, one more each ``interval`` (times ``share``)."""

from __future__ import annotations

import pytest

from pointsman_picker.flowcontrol.pace import Pace


# Times in quarters of a second: exact in binary, so the slots' edges are where the table says.
@pytest.mark.parametrize(
    ("interval", "burst", "share", "takes", "expected"),
    [
        pytest.param(0.0, 1, 1, [0.0] * 5, [True] * 5, id="no-pace"),
        pytest.param(1.0, 1, 1, [0.0, 0.0, 0.5, 1.0, 1.0], [True, False, False, True, False], id="one"),
        pytest.param(1.0, 2, 1, [0.0, 0.0, 0.0, 1.0, 1.0], [True, True, False, True, False], id="burst"),
        # Idle for a long while: only ``burst`` slots saved up.
        pytest.param(1.0, 2, 1, [0.0, 9.0, 9.0, 9.0], [True, True, True, False], id="saved-up-to-burst"),
        pytest.param(1.0, 1, 2, [0.0, 1.0, 2.0, 3.0], [True, False, True, False], id="shared-by-two"),
        # A clock that goes back takes nothing back and gives nothing.
        pytest.param(1.0, 1, 1, [4.0, 2.0, 4.0, 5.0], [True, False, False, True], id="clock-back"),
    ],
)
def test_slots(interval, burst, share, takes, expected):
    pace = Pace(interval, burst)
    got = []
    for now in takes:
        ready = pace.ready(now, share)
        if ready:
            pace.take(now, share)
        got.append(ready)
    assert got == expected


@pytest.mark.parametrize(
    ("interval", "burst", "share", "taken", "now", "slot"),
    [
        pytest.param(0.0, 1, 1, 3, 1.0, 1.0, id="no-pace"),
        pytest.param(1.0, 1, 1, 0, 1.0, 1.0, id="free-slot"),
        pytest.param(1.0, 1, 1, 1, 1.0, 2.0, id="next"),
        pytest.param(1.0, 1, 1, 1, 1.25, 2.0, id="part-way"),
        pytest.param(1.0, 1, 2, 1, 1.0, 3.0, id="shared-by-two"),
        pytest.param(1.0, 3, 1, 3, 1.0, 2.0, id="burst-spent"),
    ],
)
def test_next_slot(interval, burst, share, taken, now, slot):
    pace = Pace(interval, burst)
    for _ in range(taken):
        pace.take(1.0, share)
    assert pace.next_slot(now, share) == slot
    assert pace.ready(slot, share)


@pytest.mark.parametrize(("interval", "burst"), [(-0.1, 1), (0.01, 0)])
def test_bad_settings(interval, burst):
    with pytest.raises(ValueError, match="interval must be >= 0 and burst >= 1"):
        Pace(interval, burst)
