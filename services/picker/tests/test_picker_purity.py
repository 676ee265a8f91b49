"""The fence around the pure core: no gRPC, Redis, HTTP or clock in scheduling, resolution, goencoding;
the response builders may use protobuf stubs but not gRPC."""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

import pointsman_picker

SRC = pathlib.Path(pointsman_picker.__file__).parent
NETWORK = {"grpc", "grpc_health", "redis", "httpx", "fastapi", "starlette", "uvicorn", "aiohttp", "requests"}


@pytest.mark.parametrize(
    "module",
    [
        "pointsman_picker.scheduling",
        "pointsman_picker.resolution",
        "pointsman_picker.extproc.goencoding",
        "pointsman_picker.extproc.responses",
    ],
)
def test_pure_modules_load_no_network_library(module):
    code = f"import json, sys, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    loaded = set(json.loads(subprocess.check_output([sys.executable, "-c", code])))
    assert not loaded & NETWORK


@pytest.mark.parametrize(
    "path",
    [*sorted((SRC / "scheduling").glob("*.py")), SRC / "resolution.py", SRC / "extproc" / "goencoding.py"],
    ids=lambda p: p.name,
)
def test_pure_sources_import_no_clock_or_protocol(path):
    forbidden = NETWORK | {"time", "datetime", "envoy", "google", "asyncio", "os"}
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & forbidden
