"""Higher or lower, as a `verifiers` environment (verifiers 0.3.1's classic API): the model guesses a whole
number, the environment says "higher" or "lower" until the guess is right or the turns run out.

Deterministic, so a swarm can verify it: the secret comes from the row, the replies from the rules, the
reward from the last guess (no clock, no network, no randomness). `swarmnode tasks verifiers` exports its
rows as a task file; a run that names `verifiers.vf_higher_lower` plays it.
"""

import re

import verifiers as vf
from datasets import Dataset

NUMBER = re.compile(r"-?\d+")


def last_number(text):
    """The last whole number in `text`, or None."""
    found = NUMBER.findall(text or "")
    return int(found[-1]) if found else None


def content(message):
    text = message["content"]
    return text if isinstance(text, str) else ""


class HigherLower(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        guess = last_number(content(messages[-1]))
        secret = int(state["answer"])
        if guess == secret:
            state["final_env_response"] = [vf.UserMessage(content="Correct.")]
            return state["final_env_response"]
        if guess is None:
            return [vf.UserMessage(content="Reply with a whole number.")]
        return [vf.UserMessage(content="Higher." if guess < secret else "Lower.")]


def solved(completion, answer, **kwargs):
    """1.0 when the model's last guess is the secret, else 0.0."""
    guesses = [last_number(content(m)) for m in completion if m["role"] == "assistant"]
    return 1.0 if guesses and guesses[-1] == int(answer) else 0.0


def load_environment(count=64, high=16, max_turns=4):
    rows = [
        {
            "question": f"Guess my number from 1 to {high}. I say higher or lower.",
            "answer": str((index * 7 + 3) % high + 1),
        }
        for index in range(count)
    ]
    return HigherLower(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[solved]), max_turns=max_turns)
