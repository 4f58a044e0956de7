"""The watchdog process behind the hard time limit (django_jobguard/worker/watchdog.py): it kills
the watched process when an armed deadline passes, and only then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from django_jobguard.worker.watchdog import Watchdog


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_an_armed_deadline_that_passes_kills_the_process(sleeper):
    dog = Watchdog(pid=sleeper.pid)
    dog.start(time.monotonic() + 0.2, 0.2, "tests.Stuck [1]")
    assert sleeper.wait(timeout=20) == -signal.SIGKILL
    assert dog._proc.wait(timeout=20) == 0  # its work is done


def test_a_disarmed_job_is_not_killed_and_closing_ends_the_watchdog(sleeper):
    dog = Watchdog(pid=sleeper.pid)
    for _ in range(3):
        dog.start(time.monotonic() + 0.3, 0.3, "tests.Quick [1]")
        dog.ended()
    proc = dog._proc
    dog.close()  # the pipe closes: the watchdog exits without killing
    assert proc.returncode == 0
    assert sleeper.poll() is None


def test_ctrl_c_to_the_workers_process_group_does_not_reach_the_watchdog(sleeper):
    dog = Watchdog(pid=sleeper.pid)
    dog.start(time.monotonic() + 60, 60, "tests.Long [1]")
    assert os.getpgid(dog._proc.pid) != os.getpgid(0)
    dog.close()


def test_a_watchdog_killed_by_hand_is_replaced_at_a_later_arm(sleeper, monkeypatch):
    from django_jobguard.worker import watchdog

    monkeypatch.setattr(watchdog, "ALIVE_EVERY", 0.0)
    dog = Watchdog(pid=sleeper.pid)
    dog.start(time.monotonic() + 60, 60, "tests.Long [1]")
    first = dog._proc
    first.kill()
    first.wait(timeout=20)
    dog.start(time.monotonic() + 0.2, 0.2, "tests.Stuck [2]")  # a new watchdog, reading a new page
    assert dog._proc is not first
    assert sleeper.wait(timeout=20) == -signal.SIGKILL


def test_the_main_threads_jobs_keep_a_deadline_within_the_slack_and_name_the_job_killed(
        sleeper):
    """``start()``/``ended()`` (the main thread's jobs, nothing else armed): a job that ended
    is never killed although its deadline stays on the page; the next job started within
    :data:`SLACK` of it keeps that deadline, and a kill names that next job."""
    from django_jobguard.worker import watchdog

    dog = Watchdog(pid=sleeper.pid)
    deadline = time.monotonic() + 0.4
    dog.start(deadline, 0.4, "tests.Quick [1]")
    armed = dog._sequence
    dog.ended()
    assert watchdog._read(dog._page) == (0.0, 0.4, "tests.Quick [1]")  # not running
    time.sleep(0.8)  # past its deadline: the ended job's process lives
    assert sleeper.poll() is None
    second = time.monotonic() + 0.5
    dog.start(second, 0.5, "tests.Stuck [2]")  # its deadline is past the slack: written
    assert dog._sequence > armed and dog._deadline == second
    dog.ended()
    dog.start(second + watchdog.SLACK / 10, 0.5, "tests.Stuck [3]")  # within the slack
    assert dog._deadline == second  # kept: only the label, seconds and flag written
    assert watchdog._read(dog._page) == (second, 0.5, "tests.Stuck [3]")
    assert sleeper.wait(timeout=20) == -signal.SIGKILL
    assert dog._proc.wait(timeout=20) == 0
