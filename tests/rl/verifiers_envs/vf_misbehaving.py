"""verifiers environments a swarm cannot verify, one per `kind`, each otherwise the well-behaved game of
examples/verifiers/vf_higher_lower.py (tests/rl/test_verifiers_env.py)."""

import itertools
import random
import time

import verifiers as vf
from datasets import Dataset

ROWS = [{"question": f"Guess 1 to 16 ({i}).", "answer": str(i % 16 + 1)} for i in range(8)]


def solved(completion, answer, **kwargs):
    last = [m for m in completion if m["role"] == "assistant"][-1]
    return 1.0 if str(last["content"]).strip() == answer else 0.0


class Misbehaving(vf.MultiTurnEnv):
    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        self.calls = itertools.count()
        self.salt = time.time_ns()

    async def env_response(self, messages, state, **kwargs):
        if self.kind == "random":
            return [vf.UserMessage(content=f"Lucky number {random.randint(0, 10**9)}.")]
        if self.kind == "counter":  # state kept on the environment, between episodes
            return [vf.UserMessage(content=f"This is reply {next(self.calls)}.")]
        if self.kind == "raises" and "boom" in str(messages[-1]["content"]):
            raise ValueError("the model's turn broke the environment")
        if self.kind == "process":  # the same within a process, another in the next one
            turn = str(messages[-1]["content"])
            return [vf.UserMessage(content=f"Code {hash((self.salt, turn)) % 1000}.")]
        return [vf.UserMessage(content="Try again.")]


def load_environment(kind="honest"):
    dataset = Dataset.from_list(ROWS)
    rubric = vf.Rubric(funcs=[solved])
    if kind == "judge":
        rubric = vf.JudgeRubric(judge_client=object(), judge_model="a-remote-model")
    settings = {"timeout_seconds": 30.0} if kind == "timeout" else {}
    return Misbehaving(kind, dataset=dataset, rubric=rubric, max_turns=3, **settings)
