"""docs/deploy.md names only repository paths that exist and make targets that exist."""

from __future__ import annotations

import re

from deploy_kit import REPO

DOC = (REPO / "docs/deploy.md").read_text(encoding="utf-8")
_PATH = re.compile(r"(?<![\w/.-])((?:deploy|services|config|requirements|tests|docs)/[\w./<>-]*[\w>])")


def test_every_repository_path_it_names_exists() -> None:
    missing = []
    for path in sorted(set(_PATH.findall(DOC))):
        if "<" in path:  # a pattern like services/<name>/Dockerfile.dockerignore
            pattern = re.sub(r"<\w+>", "*", path)
            if not list(REPO.glob(pattern)):
                missing.append(path)
        elif not (REPO / path.rstrip(".")).exists():
            missing.append(path)
    assert not missing


def test_every_make_target_it_names_exists() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    named = set(re.findall(r"`make ([\w-]+)`", DOC)) | set(re.findall(r"^make ([\w-]+)", DOC, re.MULTILINE))
    assert named
    assert named <= targets
