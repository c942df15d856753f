"""The trainer saves early when a save at its next step would not finish before the time limit."""

from __future__ import annotations

from slurmrl.runtime.trainer.deadline import MARGIN_S, Deadline, job_end_from_env


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_no_time_limit_never_saves_early():
    d = Deadline(None, 10**12)
    d.step_took(100)
    assert not d.save_now() and d.seconds_left() is None


def test_saves_once_when_the_next_save_would_not_fit():
    clock = Clock()
    d = Deadline(clock.now + 300, clock=clock)
    d.step_took(60)
    d.save_took(90)
    assert not d.save_now()  # 300 s left: a step (60) and a save (90) fit, with room
    clock.now += 150  # 150 left: after the next step (60 x 1.25) a 90 s save (x 1.25) would not
    assert d.save_now()
    clock.now += 60
    assert not d.save_now()  # once per attempt: the early save stands


def test_the_first_save_is_estimated_from_the_checkpoint_size():
    clock = Clock()
    d = Deadline(clock.now + 100, checkpoint_bytes=30 * 10**9, clock=clock)  # 30 GB: ~150 s at 200 MB/s
    d.step_took(1)
    assert d.save_now()
    small = Deadline(clock.now + 100, checkpoint_bytes=10**6, clock=clock)
    small.step_took(1)
    assert not small.save_now()


def test_slow_steps_are_remembered():
    d = Deadline(0)
    d.step_took(50)
    d.step_took(1)
    assert d.step_s == 40  # decays from the slowest, does not average it away


def test_the_end_comes_from_the_script():
    assert job_end_from_env({"SLURMRL_JOB_END": "1790000000"}) == 1790000000.0
    assert job_end_from_env({"SLURMRL_JOB_END": ""}) is None and job_end_from_env({}) is None
    assert job_end_from_env({"SLURMRL_JOB_END": "UNLIMITED"}) is None
    assert MARGIN_S > 0
