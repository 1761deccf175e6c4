"""Fixtures and settings every test gets."""

from __future__ import annotations

import pytest
from hypothesis import settings

# Property tests judge behaviour, not speed: no per-example deadline. Speed is
# measured by the benchmarks in contrib/bench/, never by timed assertions; a
# busy machine (the tests run on every core, beside real agent programs) makes
# an example slow, not wrong, and Hypothesis would call it flaky.
settings.register_profile("busd", deadline=None)
settings.load_profile("busd")


@pytest.fixture(autouse=True)
def _private_state_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each test its own ``$XDG_STATE_HOME``: a ``busd serve`` it starts journals there.

    The journal is on by default, under ``$XDG_STATE_HOME/busd/``; without
    this, tests would write into the real one, and two tests' daemons would
    share (and lock) one journal.
    """
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
