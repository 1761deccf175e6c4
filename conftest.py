"""Fixtures every test gets."""

from __future__ import annotations

import pytest


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
