"""Fixtures of the container tests: the images, built once per machine and input hash."""

from __future__ import annotations

import pytest

from container.images import Images, ensure_images
from container.podman import remove_abandoned_containers, require_podman


@pytest.fixture(scope="session")
def images() -> Images:
    """runq's image, its base and the example app's image (cached; see images.py)."""
    require_podman()
    remove_abandoned_containers()
    return ensure_images()
