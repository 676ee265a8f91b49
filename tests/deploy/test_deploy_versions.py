"""One version of each image everywhere a user meets it: the Pointsman images are tagged with the
packages' version in compose, kustomize, the chart and the docs; every Redis image is the devstack's;
compose's Prometheus is the version the dashboard checks run on (the Makefile's Debian package)."""

from __future__ import annotations

import re
import tomllib

import yaml
from deploy_kit import REPO

from pointsman_devstack.redis_server import REDIS_IMAGE

VERSION = tomllib.loads((REPO / "shared/pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
# Where an image reference is written for users: manifests, compose, the chart, docs and the devstack.
PLACES = sorted(
    {
        REPO / "docker-compose.yaml",
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("deploy/**/*.yaml"),
        *REPO.glob("deploy/**/*.md"),
        *REPO.glob("tools/devstack/src/**/*.py"),
    }
)
# A tag is a version or a word such as dev or latest; not a port (pointsman-picker:9002 is a Service).
_TAG = r"(\d+\.\d+[\w.-]*|dev|latest|main|edge)\b"
_POINTSMAN_IMAGE = re.compile(rf"\bpointsman-(?:picker|collector|sim):{_TAG}")
_REDIS_IMAGE = re.compile(rf"(?<![\w/-])redis:{_TAG}")


def _found(pattern: re.Pattern[str]) -> dict[str, set[str]]:
    tags: dict[str, set[str]] = {}
    for path in PLACES:
        for tag in pattern.findall(path.read_text(encoding="utf-8")):
            tags.setdefault(tag, set()).add(str(path.relative_to(REPO)))
    return tags


def test_the_places_name_images_at_all() -> None:
    assert _found(_POINTSMAN_IMAGE)
    assert _found(_REDIS_IMAGE)


def test_every_pointsman_image_is_tagged_with_the_packages_version() -> None:
    assert set(_found(_POINTSMAN_IMAGE)) == {VERSION}


def test_the_chart_s_app_version_is_the_packages_version_and_its_images_default_to_it() -> None:
    chart = yaml.safe_load((REPO / "deploy/helm/pointsman/Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((REPO / "deploy/helm/pointsman/values.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == VERSION
    assert values["inferenceExtension"]["image"]["tag"] == ""  # "": the appVersion


def test_every_redis_image_is_the_devstack_s() -> None:
    values = yaml.safe_load((REPO / "deploy/helm/pointsman/values.yaml").read_text(encoding="utf-8"))
    bundled = values["redis"]["bundled"]["image"]
    assert f"{bundled['repository']}:{bundled['tag']}" == REDIS_IMAGE
    assert set(_found(_REDIS_IMAGE)) == {REDIS_IMAGE.split(":")[1]}


def test_compose_s_prometheus_is_the_version_the_dashboards_are_checked_on() -> None:
    deb = re.search(r"^PROMETHEUS_DEB := ([\d.]+)", (REPO / "Makefile").read_text(encoding="utf-8"), re.M)
    assert deb
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text(encoding="utf-8"))
    assert compose["services"]["prometheus"]["image"] == f"prom/prometheus:v{deb.group(1)}"
