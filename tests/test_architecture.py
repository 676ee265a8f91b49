"""The fence around the pure core: these modules must not pull in I/O libraries.

Each module is imported in a fresh interpreter so that what other tests imported cannot hide a leak.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE_MODULES = [
    "pointsman_shared.config",
    "pointsman_shared.codec",
    "pointsman_shared.durations",
    "pointsman_shared.keys",
    "pointsman_shared.model_server",
    "pointsman_shared.promparse",
    "pointsman_shared.snapshot",
    "pointsman_shared.backoff",
    "pointsman_collector.normalize",
    "pointsman_picker.resolution",
    "pointsman_picker.scheduling",
    "pointsman_picker.h2grpc.wire",
    "pointsman_picker.h2grpc.calls",
    "pointsman_picker.h2grpc.protocol",
    "pointsman_picker.assignments",
    "pointsman_sim.engine",
    "pointsman_sim.fleet",
    "pointsman_sim.calibration",
]
FORBIDDEN = ("grpc", "redis", "httpx", "fastapi", "starlette", "uvicorn", "aiohttp", "asyncio")


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io(module: str) -> None:
    probe = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", probe], text=True))
    leaked = sorted({name for name in loaded if name.split(".")[0] in FORBIDDEN})
    assert not leaked, f"{module} imports {leaked}"
