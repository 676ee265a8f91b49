"""Properties of the config reader (``config.py``) on arbitrary input: YAML documents with a wrong value at
every known path, random documents, random bytes in the file. Each is a valid config or a
:class:`ConfigError` whose problems name the path of what is wrong; never another exception."""

from __future__ import annotations

import itertools
import math
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st
from pydantic import BaseModel

from pointsman_shared.config import ConfigError, PointsmanConfig, load_document, parse_config

REPO = Path(__file__).resolve().parents[2]
BASES = [yaml.safe_load((REPO / "config" / "local.yaml").read_text())] + [
    {**yaml.safe_load(p.read_text()), "picker": {"profile": "x"}}
    for p in sorted((REPO / "config" / "profiles").glob("*.yaml"))
]

Path_ = tuple[str | int, ...]


def known_paths(model: type[BaseModel], prefix: Path_ = ()) -> list[Path_]:
    """Every field of the config as the document spells it (camelCase aliases; item 0 of a list)."""
    paths: list[Path_] = []
    for name, field in model.model_fields.items():
        path = (*prefix, field.alias or name)
        paths.append(path)
        annotation = field.annotation
        args = typing.get_args(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += known_paths(annotation, path)
        elif (
            typing.get_origin(annotation) is tuple
            and args
            and isinstance(args[0], type)
            and issubclass(args[0], BaseModel)
        ):
            paths += known_paths(args[0], (*path, 0))
        else:
            for arg in args:
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    paths += known_paths(arg, path)
    return paths


PATHS = known_paths(PointsmanConfig)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400)]),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(
        ["50ms", "2s", "1m", "-1s", "1e400s", "9" * 400 + "s", ".inf", "127.0.0.1:9002", "[::1]:0"]
    ),
    st.sampled_from(["redis://x", "Critical", "FailOpen", "vllm", "native", "0", "pointsman.dev/v1alpha1"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=3)
    ),
    max_leaves=8,
)


def with_value(doc: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``value`` at ``path`` (containers made on the way as needed)."""
    copy = yaml.safe_load(yaml.safe_dump(doc))
    node: Any = copy
    for key, following in itertools.pairwise(path):
        child = (
            node[key]
            if (isinstance(node, dict) and key in node) or (isinstance(node, list) and key < len(node))
            else None
        )
        if not isinstance(child, dict | list):
            child = [{}] if isinstance(following, int) else {}
            if isinstance(node, list):
                node[key] = child
            else:
                node[key] = child
        node = child
    node[path[-1]] = value
    return copy


def outcome(doc: Any) -> PointsmanConfig | ConfigError:
    try:
        return parse_config(doc)
    except ConfigError as exc:
        return exc


def dotted(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def starts_with_a_key(path: str, doc: dict[Any, Any]) -> bool:
    """Whether ``path`` begins with a key of ``doc`` as problems write it: as it is, quoted when it
    would read as another path (``'a.b'``, ``''``), in brackets when it is no string."""
    for key in doc:
        if isinstance(key, str):
            forms = [key if re.fullmatch(r"[^\s.\[\]\"']+", key) else repr(key)]
        else:  # pydantic names an integer key as a number, or as text beyond 64 bits
            forms = [f"[{key}]", str(key)]
        if any(path == w or path.startswith((f"{w}.", f"{w}[")) for w in forms):
            return True
    return False


def check_problems(error: ConfigError, doc: dict[str, Any]) -> None:
    assert error.problems
    for path, message in error.problems:
        assert path, message  # a field error names its path
        assert message
        assert starts_with_a_key(path, doc), (path, list(doc))  # where the document is wrong, not a default
    assert all(path in str(error) for path, _ in error.problems)


def test_the_bases_are_valid() -> None:
    for base in BASES:
        assert isinstance(outcome(base), PointsmanConfig)


@given(st.sampled_from(range(len(BASES))), st.sampled_from(PATHS), VALUES)
def test_any_value_at_any_known_path_is_valid_or_an_error_naming_that_path(
    base: int, path: Path_, value: Any
) -> None:
    doc = with_value(BASES[base], path, value)
    got = outcome(doc)
    if isinstance(got, PointsmanConfig):
        event("valid")
        return
    event("refused")
    check_problems(got, doc)
    # The only change is at ``path``: the error is in its section (a cross-field check may name a
    # sibling, e.g. priority for a criticality set beside it).
    section = dotted(path[:1])
    assert any(p.startswith(section) for p, _ in got.problems), got.problems


@given(st.dictionaries(st.sampled_from([str(p[0]) for p in PATHS]) | st.text(max_size=6), VALUES, max_size=5))
def test_random_documents_are_valid_or_errors_naming_paths(doc: dict[str, Any]) -> None:
    got = outcome(doc)
    if isinstance(got, ConfigError):
        check_problems(got, doc)


@given(
    st.sampled_from(PATHS),
    st.sampled_from(["", "x", "-1", "1e400", "1 s", "5 parsecs", "nan", "inf"]) | st.text(max_size=8),
)
def test_durations_and_addresses_of_any_text_are_valid_or_path_errors(path: Path_, text: str) -> None:
    doc = with_value({}, path, text)
    got = outcome(doc)
    if isinstance(got, ConfigError):
        check_problems(got, doc)
    else:
        for section in (got.collector, got.picker):
            for value in section.model_dump().values():
                if isinstance(value, float):
                    assert math.isfinite(value)  # a duration is finite


# The file as a whole: YAML of any shape, text that is not quite YAML, bytes that are not UTF-8.
YAML_TEXT = st.one_of(
    st.builds(lambda v: yaml.safe_dump(v), VALUES),
    st.sampled_from(
        [
            "",
            "---\n",
            "~",
            "a: 2001-02-30",
            "a: 2001-12-14 25:00:00",
            "a: !!timestamp xyz",
            "a: !!binary x",
            "a: !!int 0b",
            "a: !!float abc",
            "? [a]\n: b",
            "<<: 1",
            "a: &x [*x]",
            "pool: &p {name: a}\npicker: *p",
            "[" * 600,
            "{a: " * 200,
            "kind: PointsmanConfig\n\tpool: {}",
            "kind: PointsmanConfig\n---\nkind: PointsmanConfig\n",
            "\ufeffkind: PointsmanConfig",
            "a: !!python/object:os.system x",
        ]
    ),
    st.text(st.sampled_from("ab:-[]{}&*!|>'\"#%@` \n\t?,0."), max_size=40),
)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("config") / "pointsman.yaml"


@given(
    YAML_TEXT.map(str.encode)
    | st.binary(max_size=60)
    | st.builds(lambda t, b: t.encode() + b, YAML_TEXT, st.binary(max_size=4))
)
def test_any_file_is_a_document_or_a_config_error(config_file: Path, raw: bytes) -> None:
    config_file.write_bytes(raw)
    try:
        doc = load_document(config_file)
    except ConfigError as exc:
        error = exc
    else:
        event("document")
        assert isinstance(doc, dict)
        got = outcome(doc)
        if isinstance(got, ConfigError):
            check_problems(got, doc)
        return
    event("refused")
    assert error.problems
    assert str(config_file) in str(error)
