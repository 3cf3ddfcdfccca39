"""The vocabulary tests' shared fixture: a pipeline of smalti.vocabulary
alone (a module may define its own ``pipeline`` in its place)."""

from __future__ import annotations

import pytest

import smalti
import smalti.vocabulary


@pytest.fixture(scope="module")
def pipeline() -> smalti.Pipeline:
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})
