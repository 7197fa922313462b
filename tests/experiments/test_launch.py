"""``run_local``: a Ctrl-C in the launcher leaves no rank behind."""

from __future__ import annotations

import subprocess

import pytest

from linattn.experiments import launch


def test_ctrl_c_kills_every_rank(monkeypatch):
    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch.subprocess, "Popen", Recorded)
    monkeypatch.setattr(launch.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch.run_local(["-c", "import time; time.sleep(600)"], 2, deadline=600)
    assert len(started) == 2
    assert all(proc.returncode is not None for proc in started)  # killed and reaped
