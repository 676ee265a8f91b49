"""The architecture's fences, in one place.

The layer contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and ``make lint`` runs them; here
they run as a test too, with a control that shows a broken contract is reported. What static analysis
cannot see is checked by importing each pure module in a fresh interpreter (an import done at run time
still loads its library), and the whole import graph is checked for cycles.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = (
    "pointsman_shared",
    "pointsman_collector",
    "pointsman_picker",
    "pointsman_sim",
    "pointsman_quality",
    "pointsman_devstack",
    "pointsman_testkit",
)
IO_LIBRARIES = frozenset(
    {"grpc", "grpc_health", "redis", "httpx", "fastapi", "starlette", "uvicorn", "aiohttp", "asyncio"}
)
PROTOCOL_LIBRARIES = frozenset({"envoy", "google", "prometheus_client"})


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


PURE_MODULES: list[str] = list(_contracts()[0]["source_modules"])  # type: ignore[call-overload]


def _lint_imports(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )


def test_the_layer_contracts_hold() -> None:
    result = _lint_imports(REPO / "pyproject.toml")
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in result.stdout


def test_a_broken_contract_is_reported(tmp_path: Path) -> None:
    config = tmp_path / "contracts.toml"
    config.write_text(
        "[tool.importlinter]\n"
        f"root_packages = {json.dumps(list(PACKAGES[:3]))}\n"
        "include_external_packages = true\n"
        "[[tool.importlinter.contracts]]\n"
        'name = "the server is not pure"\n'
        'type = "forbidden"\n'
        'source_modules = ["pointsman_picker.server"]\n'
        'forbidden_modules = ["redis"]\n',
        encoding="utf-8",
    )
    result = _lint_imports(config)
    assert result.returncode != 0
    assert "pointsman_picker.server is not allowed to import redis" in result.stdout
    assert "pointsman_picker.snapshots -> redis" in result.stdout  # the indirect path is found


def test_the_pure_core_is_the_first_contract() -> None:
    assert "pointsman_picker.director" in PURE_MODULES
    assert "pointsman_picker.scheduling" in PURE_MODULES
    assert IO_LIBRARIES - {"asyncio"} <= set(_contracts()[0]["forbidden_modules"])  # type: ignore[arg-type]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_loads_no_io_library_at_run_time(module: str) -> None:
    probe = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", probe], text=True))
    leaked = sorted({name for name in loaded if name.split(".")[0] in IO_LIBRARIES | PROTOCOL_LIBRARIES})
    assert not leaked, f"{module} imports {leaked}"


def test_the_response_builders_use_protobuf_but_no_grpc() -> None:
    probe = "import sys, json, pointsman_picker.extproc.responses; print(json.dumps(sorted(sys.modules)))"
    loaded = {
        name.split(".")[0] for name in json.loads(subprocess.check_output([sys.executable, "-c", probe]))
    }
    assert "envoy" in loaded
    assert not loaded & IO_LIBRARIES


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_anywhere() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # TYPE_CHECKING imports count too
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(name)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.c", imported="a.d")
    assert _cycles(graph) == [["a.b", "a.c"]]
