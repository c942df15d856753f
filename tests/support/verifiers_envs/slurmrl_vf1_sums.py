"""A verifiers v1 taskset written for slurmrl's tests (never a hub download): add two digits.

``verifiers-v1:slurmrl_vf1_sums``. Rewards (weights 0.5 each, so a test knows the reward of a known
answer): ``correct`` (the reply holds the sum) and ``exact`` (the reply is the sum and nothing else),
so a small model first scores by the sum and moves by dropping its extra words. Config
(``environment_args``): ``tasks`` (how many sums), ``seed``, ``raise_on`` (the task whose ``exact``
raises), ``infinite`` (a taskset slurmrl refuses).
"""

import itertools
import random

import verifiers.v1 as vf

__all__ = ["SumsTaskset"]


class SumsConfig(vf.TasksetConfig):
    tasks: int = 64
    seed: int = 0
    raise_on: int = -1
    infinite: bool = False


class SumsData(vf.TaskData):
    answer: str


class SumsTask(vf.Task[SumsData]):
    @vf.reward(weight=0.5)
    async def correct(self, trace) -> float:
        return 1.0 if self.data.answer in trace.last_reply else 0.0

    @vf.reward(weight=0.5)
    async def exact(self, trace) -> float:
        if self.data.idx == self.config_raise_on:
            raise ValueError("the reward broke")
        return 1.0 if trace.last_reply.rstrip(".") == self.data.answer else 0.0


class SumsTaskset(vf.Taskset[SumsTask, SumsConfig]):
    def __init__(self, config: SumsConfig) -> None:
        super().__init__(config)
        self.INFINITE = config.infinite

    def load(self):
        rng = random.Random(self.config.seed)
        count = itertools.count() if self.config.infinite else range(self.config.tasks)
        for _ in count:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            task = SumsTask(SumsData(prompt=f"What is {a} + {b}? Answer with the number only.",
                                     system_prompt="You add numbers.", answer=str(a + b)), self.config.task)
            task.config_raise_on = self.config.raise_on
            yield task


print("slurmrl_vf1_sums imported")  # on stdout: the environment's messages must not see it
