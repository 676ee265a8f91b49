"""The quality benchmark's tests reuse the picker's test builders (``picker_builders``)."""

from __future__ import annotations

import sys
from pathlib import Path

_PICKER_TESTS = str(Path(__file__).resolve().parents[3] / "services" / "picker" / "tests")
if _PICKER_TESTS not in sys.path:
    sys.path.append(_PICKER_TESTS)
