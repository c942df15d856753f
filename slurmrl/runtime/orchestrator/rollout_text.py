"""Rollouts of a text environment: one completions request per prompt (``rollouts_per_prompt`` choices each),
with token ids and inference logprobs, scored afterwards by the environment (or the job's judge) from the texts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from slurmrl import envs
from slurmrl.contract.metrics import EnvStats
from slurmrl.runtime.orchestrator.members import Members, alone
from slurmrl.runtime.vllm.client import Server, VLLMError
from slurmrl.settings.orchestrator import OrchestratorSettings


class Sampler:
    """Completions with token ids and inference logprobs, over the OpenAI-compatible API."""

    def __init__(self, urls: list[str], tokenizer, s: OrchestratorSettings, members: Members | None = None):
        self.servers, self.tok, self.s = [Server(u, timeout=600.0) for u in urls], tokenizer, s
        self.members = members or alone(urls, s.servers_grace_s)  # a request goes to a live server
        self.adapter: str | None = None  # a LoRA policy: the adapter the servers serve the current policy as
        self.pool = ThreadPoolExecutor(max_workers=max(4, s.prompts_per_step))

    def _one(self, index: int, task: dict, step: int) -> list[dict]:
        prompt_ids = self.tok(task["prompt"], add_special_tokens=False)["input_ids"]
        body = {
            "model": self.adapter or self.s.served_model_name, "prompt": prompt_ids, "n": self.s.rollouts_per_prompt,
            "max_tokens": self.s.max_tokens, "temperature": self.s.temperature,
            "logprobs": 0, "return_tokens_as_token_ids": True,
            "seed": self.s.seed * 1_000_003 + step * 1_009 + index,  # reproducible sampling
        }
        headers = {"X-Session-ID": f"step{step}-prompt{index}"}
        try:  # the group's completions come back together, or are asked again (all of them) of a live server
            out = self.members.send(index, lambda server: server.completions(body, headers=headers),
                                    lambda out: len(out["choices"]))
        except VLLMError as e:
            raise VLLMError(f"sampling failed: {e}", e.answer) from None
        samples = []
        for choice in out["choices"]:
            lp = choice["logprobs"]
            samples.append({
                "prompt_ids": prompt_ids,
                "completion_ids": [int(t.split(":", 1)[1]) for t in lp["tokens"]],
                "logprobs": lp["token_logprobs"],
                "text": choice["text"],
                # return_routed_experts: the experts each token went to (base64 .npy), for the trainer's replay
                **({"routed_experts": choice["routed_experts"]} if choice.get("routed_experts") else {}),
            })
        return samples

    def sample(self, tasks: list[dict], step: int) -> list[list[dict]]:
        futures = [self.pool.submit(self._one, i, t, step) for i, t in enumerate(tasks)]
        return [f.result() for f in futures]


class TextRollouts:
    """A text environment's rollouts: completions, then the environment's rewards of their texts."""

    def __init__(self, sampler: Sampler, env):
        self.sampler, self.env = sampler, env

    def generate(self, tasks: list[dict], step: int) -> list[list[dict]]:
        return self.sampler.sample(tasks, step)

    def score(self, tasks: list[dict], groups: list[list[dict]]) -> list[float]:
        return envs.rewards(self.env, [task for task, group in zip(tasks, groups) for _ in group],
                            [g["text"] for group in groups for g in group])

    def stats(self) -> EnvStats | None:
        return None
