"""Episodes in tokens: a multi-turn completion as it travels, played by a worker and replayed by a validator
(spec/environments.md, On the wire).

A completion's tokens are the whole episode after the prompt: model turns as the engine sampled them, and
between them the environment's turns, each its text tokenized plainly by the run's tokenizer. `env_spans`
says where the environment's turns sit; every other token is the model's. A model turn ends at its first
EOS or at its token budget; the environment sees its text up to that EOS (`ChatTokenizer.completion_text`).

`play` and `replay_tokens` apply one rule (`after_model_turn`): the text rule of `next_step`, then the token
bound (an environment turn must leave room for one more model token). So a worker and a validator end every
episode at the same token with the same reward, and any environment token that is not what the environment
says, tokenized, was fabricated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from swarmnode.node.rl.environments import (
    Ended,
    EndedBy,
    EnvBounds,
    EnvCall,
    Environment,
    next_step,
    prefetch,
    span_bytes,
)
from swarmnode.node.rl.environments.registry import UnknownEnvironment, find_environment
from swarmnode.node.rl.environments.replay import CLIP, FabricatedTurn, MalformedTranscript, Replayed
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tokenizer import ChatTokenizer
from swarmnode.protocol.messages import EnvironmentTerms, EnvSpan, RunDescriptor


@dataclass(frozen=True)
class EpisodeRules:
    """What a multi-turn run fixes about every episode: the environment, its bounds and the token budgets."""

    env: Environment
    bounds: EnvBounds
    max_turn_tokens: int  # GrpoParams.max_new_tokens: the most tokens of one model turn
    max_completion_tokens: int  # model and environment tokens of the whole completion

    def turn_budget(self, used_tokens: int) -> int:
        """The most tokens the model's next turn may take after `used_tokens` tokens of the completion."""
        return min(self.max_turn_tokens, self.max_completion_tokens - used_tokens)


def episode_rules(descriptor: RunDescriptor) -> EpisodeRules | None:
    """The run's episode rules; None for a single-turn run (no environment named). UnknownEnvironment when
    this node lacks the named environment at the named version."""
    if not descriptor.environment:
        return None
    return rules_from_terms(descriptor.environment[0], descriptor.grpo.max_new_tokens)


def rules_from_terms(terms: EnvironmentTerms, max_turn_tokens: int) -> EpisodeRules:
    env = find_environment(terms.name, terms.max_env_bytes)
    if env.version != terms.version:
        raise UnknownEnvironment(f"the run plays {terms.name!r} version {terms.version}; this node has "
                                 f"version {env.version}")
    bounds = EnvBounds(terms.max_turns, terms.max_env_bytes, terms.max_total_bytes)
    return EpisodeRules(env, bounds, max_turn_tokens, terms.max_completion_tokens)


def default_terms(name: str, max_completion_tokens: int, bounds: EnvBounds | None = None) -> EnvironmentTerms:
    """The terms a run states for the environment `name`: its version, and its default bounds unless
    given."""
    env = find_environment(name)
    bounds = bounds or env.bounds
    return EnvironmentTerms(name, env.version, bounds.max_turns, bounds.max_env_bytes, bounds.max_total_bytes,
                            max_completion_tokens)


@dataclass(frozen=True)
class EnvReply:
    """The environment's next turn: its text and the tokens that go on the wire."""

    text: str
    tokens: tuple[int, ...]


def after_model_turn(rules: EpisodeRules, task: Task, seed: int, tokenizer: ChatTokenizer,
                     model_texts: Sequence[str], used_bytes: int, used_tokens: int) -> EnvReply | Ended:
    """What follows a model turn: the text rule (`next_step`), then the token rule. An environment turn that
    tokenizes to nothing, or leaves no room for one more model token, ends the episode with reward 0."""
    step = next_step(rules.env, task, seed, rules.bounds, model_texts, used_bytes)
    if isinstance(step, Ended):
        return step
    tokens = tuple(tokenizer.encode(step.text))
    if not tokens:
        return Ended(0.0, "empty_env_turn")
    if used_tokens + len(tokens) >= rules.max_completion_tokens:
        return Ended(0.0, "max_completion_tokens")
    return EnvReply(step.text, tokens)


# ---------------------------------------------------------------------------------------------- worker


@dataclass(frozen=True)
class ModelTurn:
    """One model turn as the engine sampled it: its tokens (ending at EOS or the budget), their logprobs
    (T,) and the hidden rows (T, hidden) TOPLOC commits to."""

    tokens: tuple[int, ...]
    logprobs: torch.Tensor
    hidden_rows: torch.Tensor
    ended_with_eos: bool


# (the completion's tokens so far, the turn's token budget) -> the model's next turn; the engine samples
# position p of the completion with the noise of (seed, p), whatever came before it.
TurnSampler = Callable[[Sequence[int], int], ModelTurn]

# One ask per episode still going, (its index, its completion's tokens so far, its turn's token budget) ->
# their next model turns, in order: a round of turns that an engine samples as one batch.
TurnAsk = tuple[int, tuple[int, ...], int]
TurnsSampler = Callable[[Sequence[TurnAsk]], Sequence[ModelTurn]]


@dataclass(frozen=True)
class PlayedEpisode:
    """A completion as played: every token, where the environment's turns are, and the reward."""

    tokens: tuple[int, ...]
    env_spans: tuple[EnvSpan, ...]
    turns: tuple[ModelTurn, ...]
    reward: float
    ended_by: EndedBy

    def logprobs(self) -> torch.Tensor:
        """One per token: the sampler's for the model's tokens, 0.0 for the environment's."""
        values = torch.zeros(len(self.tokens), dtype=torch.float32)
        ranges = model_ranges(len(self.tokens), self.env_spans)
        for (start, end), turn in zip(ranges, self.turns, strict=True):
            values[start:end] = turn.logprobs.to(torch.float32)
        return values

    def hidden_rows(self) -> torch.Tensor:
        """The model's rows only, in order: what TOPLOC proofs are built over."""
        return torch.cat([turn.hidden_rows for turn in self.turns])


@dataclass
class _Going:
    """An episode in play: its tokens so far, environment spans, model turns and their texts, bytes used."""

    tokens: list[int] = field(default_factory=list)
    spans: list[EnvSpan] = field(default_factory=list)
    turns: list[ModelTurn] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    used_bytes: int = 0


def play_all(rules: EpisodeRules, episodes: Sequence[tuple[Task, int]], tokenizer: ChatTokenizer,
             sample_turns: TurnsSampler,
             first_turns: Sequence[ModelTurn] | None = None) -> list[PlayedEpisode]:
    """Play episodes, each a (task, seed), in rounds: every round asks for the next model turn of every
    episode still going at once (`sample_turns`: an engine samples them as one batch), then appends each
    one's environment reply or ends it. `first_turns`, when given, are the first round already sampled.
    Each episode is played exactly as alone: its turns depend on its own tokens only."""
    going = {i: _Going() for i in range(len(episodes))}
    played: dict[int, PlayedEpisode] = {}
    turns = None if first_turns is None else list(first_turns)
    while going:
        order = list(going)
        if turns is None:
            asks = [(i, tuple(going[i].tokens), rules.turn_budget(len(going[i].tokens))) for i in order]
            turns = list(sample_turns(asks))
        if len(turns) != len(order):
            raise ValueError(f"{len(turns)} model turns for {len(order)} episodes in play")
        for i, turn in zip(order, turns, strict=True):
            episode = going[i]
            episode.turns.append(turn)
            episode.tokens += turn.tokens
            episode.texts.append(tokenizer.completion_text(turn.tokens))
            episode.used_bytes += span_bytes(episode.texts[-1])
        prefetch(rules.env, [(*episodes[i], tuple(going[i].texts)) for i in order
                             if going[i].used_bytes <= rules.bounds.max_total_bytes])
        for i in order:
            episode, (task, seed) = going[i], episodes[i]
            step = after_model_turn(rules, task, seed, tokenizer, episode.texts, episode.used_bytes,
                                    len(episode.tokens))
            if isinstance(step, Ended):
                played[i] = PlayedEpisode(tuple(episode.tokens), tuple(episode.spans), tuple(episode.turns),
                                          step.reward, step.by)
                del going[i]
                continue
            episode.spans.append(EnvSpan(len(episode.tokens), len(step.tokens)))
            episode.tokens += step.tokens
            episode.used_bytes += span_bytes(step.text)
        turns = None
    return [played[i] for i in range(len(episodes))]


def play(rules: EpisodeRules, task: Task, seed: int, tokenizer: ChatTokenizer,
         sample_turn: TurnSampler, first_turn: ModelTurn | None = None) -> PlayedEpisode:
    """Play one episode: sample a model turn, append the environment's reply, until the episode ends.
    `first_turn`, when given, is the model's first turn already sampled (a group's first turns share their
    context, the prompt, so an engine samples them in one batch)."""

    def one_at_a_time(asks: Sequence[TurnAsk]) -> list[ModelTurn]:
        return [sample_turn(tokens, budget) for _, tokens, budget in asks]

    firsts = None if first_turn is None else [first_turn]
    return play_all(rules, [(task, seed)], tokenizer, one_at_a_time, firsts)[0]


# ---------------------------------------------------------------------------------------------- validator


def model_ranges(length: int, env_spans: Sequence[EnvSpan]) -> list[tuple[int, int]]:
    """[start, end) of every model turn of a completion of `length` tokens (spans assumed well placed)."""
    ranges, at = [], 0
    for span in env_spans:
        ranges.append((at, span.start))
        at = span.start + span.length
    ranges.append((at, length))
    return ranges


def model_mask(length: int, env_spans: Sequence[EnvSpan]) -> torch.Tensor:
    """(length,) bool: True at the model's tokens, False at the environment's."""
    mask = torch.ones(length, dtype=torch.bool)
    for span in env_spans:
        mask[span.start : span.start + span.length] = False
    return mask


def span_layout_fault(length: int, env_spans: Sequence[EnvSpan], max_turns: int) -> str | None:
    """Why `env_spans` cannot mark environment turns in `length` tokens, or None: each span must sit
    strictly inside the completion with at least one model token before it and after it, in order, and
    the model may take at most `max_turns` turns."""
    if len(env_spans) > max_turns - 1:
        return f"{len(env_spans)} environment turns, the run allows {max_turns - 1}"
    at = 0
    for i, span in enumerate(env_spans):
        if span.start <= at:
            return f"environment span {i} does not follow a model turn"
        at = span.start + span.length
        if at >= length:
            return f"environment span {i} is not followed by a model turn"
    return None


def replay_calls(task: Task, seed: int, tokenizer: ChatTokenizer, token_ids: Sequence[int],
                 env_spans: Sequence[EnvSpan]) -> list[EnvCall]:
    """What `replay_tokens` may ask the environment of a completion: every prefix of its model turns."""
    texts = tuple(tokenizer.completion_text(token_ids[start:end])
                  for start, end in model_ranges(len(token_ids), env_spans))
    return [(task, seed, texts[:n]) for n in range(1, len(texts) + 1)]


def replay_tokens(rules: EpisodeRules, task: Task, seed: int, tokenizer: ChatTokenizer,
                  token_ids: Sequence[int], env_spans: Sequence[EnvSpan],
                  eos_token_ids: Sequence[int]) -> Replayed:
    """The reward of a completion, found by replaying the environment on its model turns.

    Every environment span must be the environment's reply tokenized (else `FabricatedTurn`), each model
    turn must end at its first EOS or at its budget, and the spans must stop where the episode does (else
    `MalformedTranscript`). Indices in errors count spans: model and environment turns alternately.
    GraderFault passes through (no verdict). `span_layout_fault` has passed (check 2b).
    """
    ranges = model_ranges(len(token_ids), env_spans)
    texts: list[str] = []
    used_bytes = 0
    for turn, (start, end) in enumerate(ranges):
        piece = token_ids[start:end]
        budget = rules.turn_budget(start)
        eos_at = next((i for i, t in enumerate(piece) if t in eos_token_ids), None)
        if len(piece) > budget or (eos_at is None and len(piece) != budget) or (
                eos_at is not None and eos_at != len(piece) - 1):
            raise MalformedTranscript(2 * turn, f"a model turn of {len(piece)} tokens must end at its first "
                                                f"EOS or at its budget of {budget}")
        texts.append(tokenizer.completion_text(piece))
        used_bytes += span_bytes(texts[-1])
        step = after_model_turn(rules, task, seed, tokenizer, texts, used_bytes, end)
        if isinstance(step, Ended):
            if turn != len(ranges) - 1:
                raise MalformedTranscript(2 * turn + 1, f"a span after the end of the episode ({step.by})")
            return Replayed(step.reward, step.by)
        if turn == len(ranges) - 1:
            raise MalformedTranscript(2 * turn + 1, "the episode is not over: the environment's turn is "
                                                    "missing")
        span = env_spans[turn]
        claimed = tuple(token_ids[span.start : span.start + span.length])
        if claimed != step.tokens:
            raise FabricatedTurn(2 * turn + 1, step.text[:CLIP], tokenizer.completion_text(claimed)[:CLIP])
        used_bytes += span_bytes(step.text)
    raise AssertionError("unreachable: the last model turn ends the walk")

