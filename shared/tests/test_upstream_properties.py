"""Properties of the upstream EndpointPickerConfig translation and the flags' overrides (``upstream.py``)
on arbitrary documents: a translated document or a :class:`ConfigError` naming paths, never another
exception; and the translation of anything it accepts is a valid config or path-naming errors too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from pointsman_shared import upstream
from pointsman_shared.config import ConfigError, PointsmanConfig, parse_config

DATA = Path(__file__).parent / "data" / "upstream"
SHIPPED = yaml.safe_load((DATA / "default-plugins.yaml").read_text())

ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
TYPES = st.sampled_from([*upstream.PLUGIN_TYPES, *upstream.IGNORED_PLUGINS, "no-such-plugin"])
PLUGIN_SPECS = st.fixed_dictionaries(
    {},
    optional={
        "type": TYPES | ANY,
        "name": st.sampled_from(["a", "b", "prefix-cache-scorer"]) | ANY,
        "parameters": st.dictionaries(st.text(max_size=6), ANY, max_size=2) | ANY,
    },
)
REFS = st.fixed_dictionaries(
    {}, optional={"pluginRef": TYPES | st.sampled_from(["a", "b"]) | ANY, "weight": st.integers(-1, 5) | ANY}
)
PROFILES = st.fixed_dictionaries(
    {},
    optional={"name": st.sampled_from(["default", "p"]) | ANY, "plugins": st.lists(REFS, max_size=4) | ANY},
)
DOCS = st.fixed_dictionaries(
    {"kind": st.just(upstream.ENDPOINT_PICKER_KIND)},
    optional={
        "apiVersion": ANY,
        "plugins": st.lists(PLUGIN_SPECS, max_size=4) | ANY,
        "schedulingProfiles": st.lists(PROFILES, max_size=3) | ANY,
        "parser": ANY,
        "extra": ANY,
        1: ANY,
    },
)


def check(error: ConfigError) -> None:
    assert error.problems
    for path, message in error.problems:
        assert isinstance(path, str)
        assert path, message
        assert message


def translate(doc: dict[Any, Any]) -> dict[str, Any] | None:
    try:
        translated, warnings = upstream.from_endpoint_picker_config(doc, "epp.yaml")
    except ConfigError as exc:
        event("refused")
        check(exc)
        return None
    assert all(isinstance(w, str) and w.startswith("epp.yaml: ") for w in warnings)
    return translated


@given(DOCS)
def test_any_endpoint_picker_config_translates_or_names_what_is_wrong(doc: dict[Any, Any]) -> None:
    translated = translate(doc)
    if translated is None:
        return
    try:
        config = parse_config(translated)
    except ConfigError as exc:
        event("translated, refused")
        check(exc)
        return
    event("valid")
    assert isinstance(config, PointsmanConfig)


@given(
    st.sampled_from(["plugins", "schedulingProfiles"]),
    st.integers(0, 3),
    st.sampled_from(["type", "pluginRef"]),
    ANY,
)
def test_the_shipped_config_with_any_value_swapped_in_translates_or_names_what_is_wrong(
    section: str, index: int, key: str, value: Any
) -> None:
    doc = yaml.safe_load(yaml.safe_dump(SHIPPED))
    items = doc.get(section) or []
    if section == "schedulingProfiles" and items:
        items = items[0].get("plugins") or []
    if items:
        items[index % len(items)][key] = value
    translated = translate(doc)
    if translated is not None:
        try:
            parse_config(translated)
        except ConfigError as exc:
            check(exc)


OVERRIDES = st.dictionaries(
    st.sampled_from(["pool", "picker", "collector"]),
    st.dictionaries(
        st.sampled_from(["name", "listen", "healthListen", "metricsListen", "kubernetes"]),
        st.integers(1, 65535)
        | st.text(max_size=6)
        | st.dictionaries(st.sampled_from(["namespace"]), st.text(max_size=4)),
        max_size=3,
    ),
    max_size=3,
)


@given(
    st.dictionaries(st.sampled_from(["pool", "picker", "collector", "models"]), ANY, max_size=3), OVERRIDES
)
def test_flags_merged_into_any_document_give_a_config_or_path_errors(
    doc: dict[str, Any], extra: dict[str, Any]
) -> None:
    merged = upstream.with_overrides(doc, extra)
    for section, fields in extra.items():
        assert set(fields) <= set(merged[section])
    try:
        parse_config(merged)
    except ConfigError as exc:
        check(exc)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("upstream") / "epp.yaml"


@given(DOCS, OVERRIDES)
def test_load_gives_a_config_or_a_config_error(
    config_file: Path, doc: dict[Any, Any], extra: dict[str, Any]
) -> None:
    config_file.write_text(yaml.safe_dump(doc))
    try:
        config, _ = upstream.load(config_file, extra=extra, environ={})
    except ConfigError as exc:
        check(exc)
        return
    assert isinstance(config, PointsmanConfig)
