"""The docs say only what is true: every repository path they name exists, every `make` target they name
is in the Makefile, every flag they show a console script taking is one it takes, every config key they
name is a field of the loader's model, every Pointsman config block they show loads with the real loader,
and the README's config, ports and errors tables match config/local.yaml and the code.

The docs checked: README.md, docs/*.md (not docs/decisions/), the Helm chart's README, the scenario
format's README and config/local.yaml's comments.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import textwrap
from collections.abc import Callable, Iterator, Sequence
from typing import Any, get_args

import pytest
import yaml
from deploy_kit import REPO
from pydantic import BaseModel

import pointsman_collector.__main__
import pointsman_devstack.__main__
import pointsman_picker.__main__
import pointsman_quality.__main__
import pointsman_sim.__main__
from pointsman_devstack import envoy
from pointsman_devstack.stack import StackPorts
from pointsman_picker import errors
from pointsman_picker.scheduling.profiles import build_profile
from pointsman_shared.config import THRESHOLD_ENV, PointsmanConfig, load_config, parse_config
from pointsman_shared.upstream import IGNORED_FLAGS

DOCS = sorted(
    [
        "README.md",
        "config/local.yaml",
        "deploy/helm/pointsman/README.md",
        "bench/scenarios/README.md",
        *(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
    ]
)
README = (REPO / "README.md").read_text(encoding="utf-8")
LOCAL_CONFIG = REPO / "config/local.yaml"
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")

_PATH = re.compile(
    r"(?<![\w/.-])((?:deploy|services|config|requirements|tests|docs|shared|tools|bench)/[\w./<>*-]*[\w>*])"
)
# Paths a run writes (git ignores them), named in the docs as where the output goes.
GENERATED = frozenset({"bench/results/quick"})


def _doc(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


def _code_blocks(text: str, lang: str = r"\w*") -> list[str]:
    """The fenced code blocks (in ``lang``), dedented when the fence is (a block inside a list item)."""
    found = re.findall(rf"^( *)```{lang}\n(.*?)^\1```", text, re.MULTILINE | re.DOTALL)
    return [textwrap.dedent(body) for _, body in found]


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a Markdown heading line) up to the next heading of any level."""
    start = text.index(f"{heading}\n")
    rest = text[start + len(heading) + 1 :]
    end = re.search(r"^#{1,6} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _table_rows(section: str) -> list[list[str]]:
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]  # past the header and its rule


# --- paths and make targets ----------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS)
def test_every_repository_path_it_names_exists(doc: str) -> None:
    missing = []
    for path in sorted(set(_PATH.findall(_doc(doc)))):
        path = path.rstrip(".")
        if path in GENERATED:
            continue
        if "<" in path or "*" in path:  # a pattern like services/<name>/Dockerfile or quality-*.md
            if not list(REPO.glob(re.sub(r"<\w+>", "*", path))):
                missing.append(path)
        elif not (REPO / path).exists():
            missing.append(path)
    assert not missing


MAKE_TARGETS = frozenset(re.findall(r"^([\w-]+):", MAKEFILE, re.MULTILINE))
# The targets `make help` lists (a `## ` comment after the target).
HELP_TARGETS = frozenset(re.findall(r"^([\w-]+):.*## ", MAKEFILE, re.MULTILINE))


@pytest.mark.parametrize("doc", DOCS)
def test_every_make_target_it_names_exists(doc: str) -> None:
    text = _doc(doc)
    named = set(re.findall(r"`make ([\w-]+)[^`]*`", text)) | set(
        re.findall(r"^make ([\w-]+)", text, re.MULTILINE)
    )
    assert named <= MAKE_TARGETS


def test_the_readme_names_every_target_make_help_lists() -> None:
    named = set(re.findall(r"`(?:make )?([\w-]+)`", README))
    assert HELP_TARGETS - named == set()


# --- flags ---------------------------------------------------------------------------------------

SCRIPTS: dict[str, Callable[[Sequence[str]], object]] = {
    "pointsman-picker": pointsman_picker.__main__.main,
    "pointsman-collector": pointsman_collector.__main__.main,
    "pointsman-sim": pointsman_sim.__main__.main,
    "pointsman-stack": pointsman_devstack.__main__.main,
    "pointsman-quality": pointsman_quality.__main__.main,
}
_FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")
_INVOCATION = re.compile(r"\b(pointsman-(?:picker|collector|sim|stack|quality))\b([^|;&>]*)")


@functools.cache
def script_flags(script: str) -> frozenset[str]:
    """The flags ``script --help`` lists, read in-process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        SCRIPTS[script](["--help"])
    return frozenset(_FLAG.findall(out.getvalue()))


def _command_units(doc: str) -> Iterator[str]:
    """Where a command is written: each line of a code block and each inline code span (Markdown), or
    each line (any other file)."""
    text = _doc(doc)
    if not doc.endswith(".md"):
        yield from text.splitlines()
        return
    for block in _code_blocks(text):
        yield from block.splitlines()
    prose = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.MULTILINE | re.DOTALL)
    yield from re.findall(r"`([^`\n]+)`", prose)


@pytest.mark.parametrize("doc", DOCS)
def test_every_flag_shown_with_a_console_script_is_one_it_takes(doc: str) -> None:
    unknown = []
    for unit in _command_units(doc):
        for script, args in _INVOCATION.findall(unit):
            unknown += [(script, flag) for flag in _FLAG.findall(args) if flag not in script_flags(script)]
    assert not unknown


def test_the_upstream_flags_picker_md_lists_are_the_picker_s_and_but_for_grpc_the_collector_s() -> None:
    section = _section(_doc("docs/picker.md"), "## The upstream picker's flags")
    flags = set(_FLAG.findall(section))
    assert {"--pool-name", "--config-file", "--grpc-health-port"} <= flags
    ignored = {f"--{name}" for name in IGNORED_FLAGS}
    assert flags - script_flags("pointsman-picker") - ignored == set()
    grpc_ports = {"--grpc-port", "--grpc-health-port"}
    assert flags - grpc_ports - script_flags("pointsman-collector") - ignored == set()
    assert script_flags("pointsman-collector") & grpc_ports == set()


# Where each command line's flags are documented.
CLI_DOCS = {
    "pointsman-picker": ("docs/picker.md",),
    "pointsman-collector": ("docs/collector.md", "docs/picker.md"),
    "pointsman-sim": ("docs/simulator.md",),
    "pointsman-stack": ("README.md",),
    "pointsman-quality": ("docs/quality.md",),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_flag_a_command_line_lists_is_documented(script: str) -> None:
    documented = set().union(*(_FLAG.findall(_doc(doc)) for doc in CLI_DOCS[script]))
    assert script_flags(script) - {"--help"} - documented == set()


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_command_line_says_its_version(script: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        SCRIPTS[script](["--version"])
    assert re.fullmatch(rf"{script} \d+\.\d+\.\d+\n", out.getvalue())


def test_every_flag_the_simulator_doc_names_is_the_simulator_s() -> None:
    flags = set(_FLAG.findall(_doc("docs/simulator.md")))
    assert flags - script_flags("pointsman-sim") == set()


# --- config keys and config blocks ---------------------------------------------------------------

_SECTIONS = (
    "pool",
    "models",
    "objectives",
    "scheduling",
    "redis",
    "collector",
    "picker",
    "plugins",
    "profiles",
    "tracing",
)
_DOTTED = rf"(?:{'|'.join(_SECTIONS)})(?:\.[A-Za-z]+)+"
# In Markdown a key is a code span (`picker.maxStaleness`, `picker.server: grpcio`); in YAML comments, bare.
_KEY_MD = re.compile(rf"`({_DOTTED})(?:[:\s][^`]*)?`")
_KEY_BARE = re.compile(rf"(?<![\w./-])({_DOTTED})")
_FILE_SUFFIXES = frozenset({"json", "py", "yaml", "md", "txt", "log"})


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (model := _model_of(arg)) is not None:
            return model
    return None


def _is_field(path: str) -> bool:
    model: type[BaseModel] | None = PointsmanConfig
    for part in path.split("."):
        if model is None:
            return False
        field = next((f for name, f in model.model_fields.items() if part in (f.alias, name)), None)
        if field is None:
            return False
        model = _model_of(field.annotation)
    return True


# Docs that name no config key (so a key pattern that matches nothing fails in the others).
UNKEYED = frozenset(
    {
        "bench/scenarios/README.md",
        "docs/envoy.md",
        "docs/simulator.md",
        "docs/upstream-spec.md",
        "docs/vllm-figures.md",
    }
)


# The Helm chart's README names values (`collector.replicas`), not config keys.
@pytest.mark.parametrize("doc", [d for d in DOCS if not d.startswith("deploy/helm/")])
def test_every_config_key_it_names_is_a_field(doc: str) -> None:
    pattern = _KEY_MD if doc.endswith(".md") else _KEY_BARE
    named = {key for key in pattern.findall(_doc(doc)) if key.rsplit(".", 1)[1] not in _FILE_SUFFIXES}
    assert named or doc in UNKEYED
    assert {key for key in named if not _is_field(key)} == set()


def test_the_key_check_refuses_a_misspelt_key() -> None:
    assert _is_field("picker.passthroughUnknownModels")
    assert _is_field("pool.kubernetes.apiVersion")
    assert not _is_field("picker.passthroughUnknownModel")
    assert not _is_field("pool.kubernetes.apiVersion.x")


def _loads(text: str, source: str) -> PointsmanConfig:
    """The config ``text`` states, as the services would run it: loaded, and its profile built."""
    config = parse_config(yaml.safe_load(text), source=source, environ={})
    build_profile(config)
    return config


def _config_blocks() -> Iterator[tuple[str, int, str]]:
    for doc in DOCS:
        if not doc.endswith(".md"):
            continue
        for i, block in enumerate(_code_blocks(_doc(doc), "yaml")):
            keys = yaml.safe_load(block)
            if isinstance(keys, dict) and set(keys) & set(_SECTIONS):
                yield doc, i, block


CONFIG_BLOCKS = list(_config_blocks())


def test_the_docs_show_config_blocks() -> None:
    assert {doc for doc, _, _ in CONFIG_BLOCKS} >= {"README.md", "docs/picker.md", "docs/collector.md"}


@pytest.mark.parametrize(
    ("doc", "index", "block"), CONFIG_BLOCKS, ids=[f"{d}[{i}]" for d, i, _ in CONFIG_BLOCKS]
)
def test_every_config_block_loads(doc: str, index: int, block: str) -> None:
    _loads(block, f"{doc} yaml block {index}")


# --- the README's config block -------------------------------------------------------------------


def _readme_config() -> str:
    return _code_blocks(_section(README, "## The config file"), "yaml")[0]


_COMMENTED_KEY = re.compile(r"^(\s*)# (?=[A-Za-z]+: )", re.MULTILINE)


def test_the_readme_config_loads_with_its_commented_out_keys_too() -> None:
    block = _readme_config()
    uncommented, count = _COMMENTED_KEY.subn(r"\1", block)
    assert count >= 5
    _loads(block, "README.md")
    _loads(uncommented, "README.md, commented-out keys included")


def _marked_defaults(block: str) -> Iterator[tuple[list[str], str]]:
    """(key path, line) of each mapping key whose comment says ``(default)``."""
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = re.match(r"^(\s*)(?:# )?([A-Za-z]+):(.*)$", line)
        if match is None:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if "(default)" in match.group(3).partition("#")[2]:
            yield [k for _, k in stack], line


def _at(doc: dict[str, Any], path: list[str]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def test_what_the_readme_config_marks_default_is_the_default() -> None:
    block = _COMMENTED_KEY.sub(r"\1", _readme_config())
    given = _loads(block, "README.md").model_dump(mode="json", by_alias=True)
    default = PointsmanConfig().model_dump(mode="json", by_alias=True)
    marked = list(_marked_defaults(block))
    assert len(marked) >= 10
    assert [line for path, line in marked if _at(given, path) != _at(default, path)] == []


def test_the_readme_config_names_each_environment_override_on_its_key() -> None:
    lines = _readme_config().splitlines()
    overrides = {**THRESHOLD_ENV, "url": "REDIS_URL"}
    for key, variable in overrides.items():
        line = next(line for line in lines if line.strip().startswith(f"{key}:"))
        assert variable in line


def test_config_local_yaml_names_the_environment_overrides() -> None:
    text = LOCAL_CONFIG.read_text(encoding="utf-8")
    assert all(variable in text for variable in [*THRESHOLD_ENV.values(), "REDIS_URL"])


# --- the README's ports and errors tables --------------------------------------------------------


def test_the_readme_ports_are_the_local_stack_s() -> None:
    ports = StackPorts.from_config(load_config(LOCAL_CONFIG, environ={}))
    expected = {
        envoy.DEFAULT_GATEWAY_PORT: "Envoy gateway",
        envoy.DEFAULT_ADMIN_PORT: "Envoy admin",
        ports.picker: "ext_proc",
        ports.picker_health: "health",
        ports.picker_metrics: "metrics",
        ports.collector: "collector",
        **dict.fromkeys(ports.pods, "simulator"),
    }
    documented: dict[int, str] = {}
    for cell, what in _table_rows(_section(README, "## Ports (local stack)")):
        if match := re.fullmatch(r"(\d+)(?:\u2013(\d+))?", cell):
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            documented.update(dict.fromkeys(range(first, last + 1), what))
    assert set(documented) == set(expected)
    assert [port for port, word in expected.items() if word not in documented[port]] == []


def test_the_readme_errors_table_has_every_status_the_picker_answers() -> None:
    statuses = {int(row[1]) for row in _table_rows(_section(README, "## Errors returned to clients"))}
    answered = {errors.PickerError.status} | {cls.status for cls in errors.PickerError.__subclasses__()}
    assert answered <= statuses


# --- the Helm chart's README ---------------------------------------------------------------------


def test_the_chart_readme_names_every_example_values_file() -> None:
    readme = _doc("deploy/helm/pointsman/README.md")
    files = sorted((REPO / "deploy/helm/pointsman/ci").glob("*.yaml"))
    assert files
    assert [f.stem for f in files if f"`{f.stem}`" not in readme] == []
