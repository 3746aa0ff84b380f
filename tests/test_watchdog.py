"""The watchdog waits for its worker asleep: it runs beside every measured window."""

from __future__ import annotations

import resource
import subprocess
import time

import pytest

from ptspeed.launch.watchdog import wait_blocking

WAIT_S = 1.0


def wakeups_while(wait: object) -> int:
    """Voluntary context switches of this process while ``wait`` waits for a 1 s worker."""
    process = subprocess.Popen(["sleep", str(WAIT_S)])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    wait(process)  # type: ignore[operator]
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before


def test_the_watchdog_sleeps_until_its_worker_ends() -> None:
    """Popen.wait with a timeout wakes every few ms to 50 ms (a poll loop); the watchdog's
    wait wakes once or twice, whatever the timeout."""
    polling = wakeups_while(lambda p: p.wait(timeout=600))
    blocking = wakeups_while(lambda p: wait_blocking(p, 600))
    assert polling >= 15, polling  # what the watchdog did before
    assert blocking <= 5, blocking


def test_the_watchdogs_wait_times_out_as_popen_does() -> None:
    process = subprocess.Popen(["sleep", "30"])
    begun = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        wait_blocking(process, 0.3)
    assert 0.25 <= time.monotonic() - begun < 5
    process.kill()
    assert wait_blocking(process, 10) == -9
