"""Workload models that generate request traces: multi-turn chat, a coding agent, RAG.

Each model is a small, documented stochastic process with a fixed seed, so that a trace
is reproducible to the byte (``generate(name, seed)``); the built-in traces shipped in
``data/traces/`` are their output at the default seed (``tests/tools/test_builtin.py``
regenerates and compares them). docs/simulator.md states every parameter.

Ids follow how engines hash prefix blocks: a full block of a context keeps its id; the
partial last block of a context that grows gets a new id once it is extended; content
that many requests share (a system prompt, a tool set, a retrieved document) has the
same ids wherever it sits at the same prefix.

This module writes traces; it does not read them or simulate anything.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

DEFAULT_SEED = 2024


def _lognormal(rng: np.random.Generator, median: float, sigma: float, low: int = 1,
               high: int = 1 << 30) -> int:
    return int(np.clip(rng.lognormal(np.log(median), sigma), low, high))


class GrowingContext:
    """A growing token context cut into blocks of ``block`` tokens, with the ids an
    engine would give them."""

    def __init__(self, block: int, next_id: Callable[[], int],
                 prefix_ids: list[int] | None = None, prefix_tokens: int = 0):
        self.block = block
        self.next_id = next_id
        self.full: list[int] = list(prefix_ids or [])
        self.tokens = prefix_tokens
        self.partial: int | None = None

    def extend(self, tokens: int) -> None:
        if tokens <= 0:
            return
        before_full = self.tokens // self.block
        self.tokens += tokens
        after_full = self.tokens // self.block
        # a block that was partial and is now full has new content: a new id
        self.full += [self.next_id() for _ in range(after_full - before_full)]
        self.partial = self.next_id() if self.tokens % self.block else None

    def ids(self) -> list[int]:
        return self.full + ([self.partial] if self.partial is not None else [])


class IdCounter:
    """Block ids counted up from ``start``: each call gives the next."""

    def __init__(self, start: int = 1):
        self.value = start - 1

    def __call__(self) -> int:
        self.value += 1
        return self.value


def _jsonl(records: list[dict]) -> bytes:
    """JSONL, gzip-compressed with no timestamp in the header: the same bytes every run."""
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(text.encode())
    return out.getvalue()


# ---- multi-turn chat (Mooncake JSONL, 512-token blocks) ----

@dataclass(frozen=True)
class ChatModel:
    """Conversations arrive as a Poisson process; each opens with one of a few shared
    system prompts, then alternates user turns and replies. The next turn comes after a
    think time; sometimes the user comes back much later."""

    block: int = 512
    hours: float = 1.0
    conversations_per_minute: float = 10.0
    system_prompts: tuple[int, ...] = (1024, 2048, 1536, 3072)   # tokens
    system_weights: tuple[float, ...] = (0.45, 0.3, 0.15, 0.1)
    mean_turns: float = 4.0                    # geometric
    user_tokens_median: float = 180.0
    reply_tokens_median: float = 320.0
    paste_share: float = 0.12                  # turns that paste a document
    paste_tokens_median: float = 2500.0
    think_seconds_mean: float = 75.0           # exponential
    return_share: float = 0.12                 # gaps where the user comes back later
    return_seconds_mean: float = 1200.0


def multi_turn_chat(seed: int = DEFAULT_SEED, scale: float = 1.0,
                    model: ChatModel = ChatModel()) -> bytes:
    model = replace(model, conversations_per_minute=model.conversations_per_minute * scale)
    rng = np.random.default_rng(seed)
    ids = IdCounter()
    prompts = []
    for tokens in model.system_prompts:
        full = [ids() for _ in range(tokens // model.block)]
        prompts.append((full, tokens))
    horizon = model.hours * 3600.0
    requests: list[tuple[float, int, dict]] = []
    t = 0.0
    while True:
        t += rng.exponential(60.0 / model.conversations_per_minute)
        if t >= horizon:
            break
        prefix, prefix_tokens = prompts[rng.choice(len(prompts), p=model.system_weights)]
        context = GrowingContext(model.block, ids, prefix[:prefix_tokens // model.block],
                                 (prefix_tokens // model.block) * model.block)
        context.extend(prefix_tokens % model.block)
        at = t
        for _turn in range(rng.geometric(1.0 / model.mean_turns)):
            context.extend(_lognormal(rng, model.user_tokens_median, 0.8))
            if rng.random() < model.paste_share:
                context.extend(_lognormal(rng, model.paste_tokens_median, 0.6))
            reply = _lognormal(rng, model.reply_tokens_median, 0.7, 8, 4096)
            requests.append((at, len(requests), {
                "timestamp": int(at * 1000), "input_length": context.tokens,
                "output_length": reply, "hash_ids": context.ids()}))
            context.extend(reply)
            gap = rng.exponential(model.return_seconds_mean) \
                if rng.random() < model.return_share else rng.exponential(
                    model.think_seconds_mean)
            at += gap + reply / 40.0
            if at >= horizon:
                break
    requests.sort(key=lambda r: (r[0], r[1]))
    return _jsonl([r for _, _, r in requests])


# ---- coding agent (sessions JSONL, 64-token blocks, ids local to each session) ----

@dataclass(frozen=True)
class AgentModel:
    """Coding-agent sessions (in the layout of Claude Code captures): a large system
    prompt and tool set, then user tasks; each task is a loop of model calls, each
    adding its reply and a tool result to the context. A call sometimes starts a
    sub-agent with its own, smaller prompt; the main loop waits for it. A context past
    the compaction limit is summarised and restarted. Users pause between tasks, now and
    then for long."""

    block: int = 64
    sessions: int = 24
    tasks_mean: float = 3.0                      # per session, geometric
    system_tokens: int = 14_000
    subagent_system_tokens: int = 3_500
    task_tokens_median: float = 150.0
    steps_mean: float = 7.0                      # model calls per task, geometric
    reply_tokens_median: float = 220.0
    tool_tokens_median: float = 1_200.0
    tool_seconds_mean: float = 4.0
    decode_tokens_per_second: float = 60.0
    subagent_share: float = 0.12                 # calls that start a sub-agent
    subagent_steps_mean: float = 4.0
    compact_at_tokens: int = 90_000
    summary_tokens: int = 3_000
    think_seconds_mean: float = 150.0
    break_share: float = 0.2
    break_seconds_mean: float = 1_800.0


def coding_agent(seed: int = DEFAULT_SEED, scale: float = 1.0,
                 model: AgentModel = AgentModel()) -> bytes:
    model = replace(model, sessions=max(1, round(model.sessions * scale)))
    rng = np.random.default_rng(seed)
    records = []
    for number in range(model.sessions):
        ids = IdCounter(0)
        system = [ids() for _ in range(model.system_tokens // model.block)]
        sub_system = [ids() for _ in range(model.subagent_system_tokens // model.block)]
        requests: list[dict] = []
        context = GrowingContext(model.block, ids, system, len(system) * model.block)
        t = 0.0

        def call(ctx: GrowingContext, at: float, kind: str) -> tuple[dict, float]:
            reply = _lognormal(rng, model.reply_tokens_median, 0.8, 4, 8192)
            request = {"t": round(at, 3), "in": ctx.tokens, "out": reply, "type": kind,
                       "hash_ids": ctx.ids()}
            ctx.extend(reply + _lognormal(rng, model.tool_tokens_median, 1.0, 10, 40_000))
            return request, reply / model.decode_tokens_per_second + rng.exponential(
                model.tool_seconds_mean)

        for _task in range(rng.geometric(1.0 / model.tasks_mean)):
            context.extend(_lognormal(rng, model.task_tokens_median, 0.9))
            for _step in range(rng.geometric(1.0 / model.steps_mean)):
                request, took = call(context, t, "main")
                requests.append(request)
                if rng.random() < model.subagent_share:
                    sub = GrowingContext(model.block, ids, sub_system,
                                         len(sub_system) * model.block)
                    sub.extend(_lognormal(rng, 400.0, 0.6))
                    offset, group = took, []
                    for _ in range(rng.geometric(1.0 / model.subagent_steps_mean)):
                        nested, sub_took = call(sub, offset, "subagent")
                        group.append(nested)
                        offset += sub_took
                    request["requests"] = group  # their t count from the parent's
                    took = offset
                t += took
                if context.tokens > model.compact_at_tokens:
                    context = GrowingContext(model.block, ids, system, len(system) * model.block)
                    context.extend(model.summary_tokens)
            pause = rng.exponential(model.break_seconds_mean) \
                if rng.random() < model.break_share else rng.exponential(
                    model.think_seconds_mean)
            t += pause
        records.append({"id": f"agent-{number:02d}", "block_size": model.block,
                        "hash_id_scope": "local", "requests": requests})
    return _jsonl(records)


# ---- RAG (Qwen-Bailian JSONL, 16-token blocks) ----

@dataclass(frozen=True)
class RagModel:
    """Retrieval-augmented questions: a shared system prompt, the top retrieved chunks
    of a corpus whose popularity is Zipf-distributed (most relevant first), then the
    question. Some answers get a follow-up question in the same chat."""

    block: int = 16
    hours: float = 1.0
    questions_per_minute: float = 12.0
    system_tokens: int = 640
    corpus_chunks: int = 1_500
    chunk_tokens: int = 256
    zipf_exponent: float = 1.15
    retrieved: int = 3
    question_tokens_median: float = 40.0
    answer_tokens_median: float = 180.0
    follow_up_share: float = 0.3
    follow_up_seconds_mean: float = 45.0


def rag(seed: int = DEFAULT_SEED, scale: float = 1.0, model: RagModel = RagModel()) -> bytes:
    model = replace(model, questions_per_minute=model.questions_per_minute * scale)
    rng = np.random.default_rng(seed)
    ids = IdCounter()
    system = [ids() for _ in range(model.system_tokens // model.block)]
    per_chunk = model.chunk_tokens // model.block
    chunk_ids: dict[tuple[int, ...], list[int]] = {}  # ids of a chunk at a prefix of chunks
    popularity = 1.0 / np.arange(1, model.corpus_chunks + 1) ** model.zipf_exponent
    popularity /= popularity.sum()
    horizon = model.hours * 3600.0
    rows: list[tuple[float, int, dict]] = []
    chat = 0
    t = 0.0
    while True:
        t += rng.exponential(60.0 / model.questions_per_minute)
        if t >= horizon:
            break
        picked = rng.choice(model.corpus_chunks, size=model.retrieved, replace=False,
                            p=popularity)
        full = list(system)
        for depth in range(model.retrieved):
            key = tuple(int(c) for c in picked[:depth + 1])
            if key not in chunk_ids:
                chunk_ids[key] = [ids() for _ in range(per_chunk)]
            full += chunk_ids[key]
        context = GrowingContext(model.block, ids, full, len(full) * model.block)
        context.extend(_lognormal(rng, model.question_tokens_median, 0.6))
        parent, turn, at, kind = -1, 1, t, "search"
        while True:
            answer = _lognormal(rng, model.answer_tokens_median, 0.6, 8, 2048)
            rows.append((at, len(rows), {
                "chat_id": chat, "parent_chat_id": parent, "timestamp": round(at, 3),
                "input_length": context.tokens, "output_length": answer, "type": kind,
                "turn": turn, "hash_ids": context.ids()}))
            if rng.random() >= model.follow_up_share:
                break
            context.extend(answer + _lognormal(rng, model.question_tokens_median, 0.6))
            parent, turn, kind = chat, turn + 1, "text"
            chat += 1
            at += rng.exponential(model.follow_up_seconds_mean) + answer / 40.0
            if at >= horizon:
                break
        chat += 1
    rows.sort(key=lambda r: (r[0], r[1]))
    return _jsonl([r for _, _, r in rows])


@dataclass(frozen=True)
class Workload:
    name: str
    format: str
    summary: str
    generate: Callable[[int, float], bytes]
    scales: str                   # what --scale multiplies


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("multi-turn-chat", "mooncake",
             "chat conversations over shared system prompts, 512-token blocks, 1 hour",
             multi_turn_chat, "the conversation arrival rate"),
    Workload("coding-agent", "sessions",
             "coding-agent sessions with sub-agents and compaction, 64-token blocks",
             coding_agent, "the number of sessions"),
    Workload("rag", "bailian",
             "retrieval-augmented questions over a Zipf-popular corpus, 16-token blocks",
             rag, "the question arrival rate"),
)}


def generate(name: str, seed: int = DEFAULT_SEED, scale: float = 1.0) -> bytes:
    """The gzip-compressed JSONL of workload ``name`` at ``seed``; ``scale`` multiplies
    its load (``Workload.scales``)."""
    if scale <= 0:
        raise ValueError("scale must be positive")
    return WORKLOADS[name].generate(seed, scale)
