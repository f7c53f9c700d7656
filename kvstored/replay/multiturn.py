"""The multi-round experiment of the Mooncake SSD-offload write-up, on fresh embedded
stores: N clients, each holding a conversation that grows every round (as SGLang's
``bench_multiturn.py`` does), replayed twice on stores of the same DRAM size, DRAM only
and then DRAM+SSD.

A round adds about ``context`` tokens to every conversation (three quarters the user's
turn, one quarter the reply, which the next round's prompt carries); the clients take
their turns one after another within a round, so when the conversations outgrow DRAM an
LRU tier evicts exactly the context the next client needs. Block ids follow the engine's
rule (``kvstored.tools.workloads.GrowingContext``): a full block keeps its id, a partial
last block gets a new one once it grows.

By default DRAM is sized to overflow part way, as in the original (there from round 7 of
10): it holds, at the store's high watermark, the blocks of the first ``overflow_round -
1`` rounds and half of that round. The SSD holds everything.

Per round and per run: the token hit rate by tier, the simulator's prediction for the
same store, and an estimated TTFT: the missed tokens at ``prefill_tps`` plus the measured
time of the get that loaded the hit blocks (the mean over the round's requests).

This module generates and runs the experiment; the tables and plots are ``report`` and
``plots``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import kvstored
from kvstored.replay.embedded import EmbeddedStore
from kvstored.replay.predict import StorePolicy, capacities
from kvstored.replay.report import difference, predicted_rates, tier_rates
from kvstored.replay.runner import RequestOutcome
from kvstored.replay.session import replay_trace
from kvstored.replay.workload import Workload
from kvstored.tools import events
from kvstored.tools.tiered import DEFAULT_PREFILL_TOKENS_PER_S, TierReplay
from kvstored.tools.workloads import GrowingContext, IdCounter

SCHEMA = "kvstored.replay.multiturn/1"
#: The two runs, in order: label, the settings that make the store so.
RUNS = (("dram_only", {"policy.dram_only": "true"}), ("dram_ssd", {}))
#: The SSD of the DRAM-only store: unused (it offloads nothing), but a backend needs one.
DRAM_ONLY_SSD = 64 << 20
_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


@dataclass(frozen=True)
class MultiturnSpec:
    clients: int
    rounds: int
    context_tokens: int = 4096
    block_tokens: int = 512
    seed: int = 0

    @classmethod
    def parse(cls, text: str, **options: Any) -> MultiturnSpec:
        """``"20x10"``: 20 clients, 10 rounds."""
        match = _SHAPE.match(text)
        if not match or not int(match.group(1)) or not int(match.group(2)):
            raise ValueError(f"--multiturn takes CLIENTSxROUNDS, e.g. 20x10, not {text!r}")
        return cls(int(match.group(1)), int(match.group(2)), **options)

    @property
    def overflow_round(self) -> int:
        """The round in which the default DRAM overflows (7 of 10, as in the original)."""
        return max(2, min(self.rounds, math.ceil(0.7 * self.rounds)))


@dataclass(frozen=True)
class Conversations:
    trace: events.EventTrace
    #: The round (1-based) of every request.
    rounds: np.ndarray
    #: Distinct blocks the store has seen once round r (1-based, index r) is done.
    blocks_after: list[int]


def conversations(spec: MultiturnSpec) -> Conversations:
    """The experiment's requests, round by round, client after client."""
    rng = np.random.default_rng(spec.seed)
    ids = IdCounter()
    contexts = [GrowingContext(spec.block_tokens, ids) for _ in range(spec.clients)]
    flat: list[int] = []
    counts, inputs, outputs, stamps, rounds = [], [], [], [], []
    seen: set[int] = set()
    blocks_after = [0]
    for round_ in range(1, spec.rounds + 1):
        for client, context in enumerate(contexts):
            turn = max(1, int(spec.context_tokens * rng.uniform(0.75, 1.25)))
            reply = turn // 4
            context.extend(turn - reply)
            request = context.ids()
            flat += request
            seen.update(request)
            counts.append(len(request))
            inputs.append(context.tokens)
            outputs.append(reply)
            stamps.append((round_ - 1) * 60.0 + client * 60.0 / spec.clients)
            rounds.append(round_)
            context.extend(reply)
        blocks_after.append(len(seen))
    trace = events.build(np.asarray(flat, dtype=np.int64), np.asarray(counts),
                         np.asarray(inputs), np.asarray(stamps), np.asarray(outputs),
                         spec.block_tokens, "mooncake",
                         sources=[f"multiturn {spec.clients}x{spec.rounds}"])
    return Conversations(trace, np.asarray(rounds), blocks_after)


def default_sizes(spec: MultiturnSpec, convo: Conversations, block_bytes: int,
                  policy: StorePolicy, key_bytes: int) -> tuple[int, int]:
    """DRAM that overflows in ``spec.overflow_round``, and an SSD that holds everything
    (bytes)."""
    fake = {"nodes": [{"backend": policy.backend}],
            "tiers": {"dram": {"capacity_bytes": 1 << 40}, "ssd": {"capacity_bytes": 1 << 40}}}
    caps = capacities(fake, block_bytes, key_bytes, policy)
    k = spec.overflow_round
    blocks = (convo.blocks_after[k - 1] + convo.blocks_after[k]) / 2
    dram = math.ceil(blocks * caps.dram_object_bytes / caps.dram_fill)
    dram = -(-dram // 4096) * 4096
    ssd = math.ceil(1.25 * convo.blocks_after[-1] * caps.ssd_object_bytes / caps.ssd_fill)
    return dram, max(ssd, 64 << 20)


def _round_summary(outcomes: list[RequestOutcome], prefill_tps: float) -> dict[str, Any]:
    rates = tier_rates(outcomes)
    ttft = [(o.tokens - o.hit_tokens) / prefill_tps + (o.get_seconds or 0.0)
            for o in outcomes]
    return {"hit_rate": rates["hit_rate"], "dram_hit_rate": rates["dram_hit_rate"],
            "ssd_hit_rate": rates["ssd_hit_rate"],
            "ttft_s": float(np.mean(ttft)) if ttft else 0.0,
            "load_s": float(np.mean([o.get_seconds or 0.0 for o in outcomes]))
            if outcomes else 0.0}


def _whole_run(outcomes: list[RequestOutcome], model: TierReplay) -> dict[str, Any]:
    """Measured and predicted over every request of a run, and their difference."""
    measured = tier_rates(outcomes)
    predicted = predicted_rates(model, slice(0, len(outcomes)))
    return {"measured": measured, "predicted": predicted,
            "difference_pp": difference(measured, predicted)}


def run(spec: MultiturnSpec, *, block_bytes: int, dram: int | None = None,
        ssd: int | None = None, prefill_tps: float = DEFAULT_PREFILL_TOKENS_PER_S,
        concurrency: int = 1,
        progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Both runs; the ``--multiturn --json`` document. ``progress(label, done, total)``."""
    convo = conversations(spec)
    workload = Workload(convo.trace)
    namespace = "multiturn"
    key_bytes = len(workload.request(0).keys(namespace)[0].encode())
    local = StorePolicy.from_config(EmbeddedStore(dram=1, ssd=1).config())
    default_dram, default_ssd = default_sizes(spec, convo, block_bytes, local, key_bytes)
    dram = dram or default_dram
    ssd = ssd or default_ssd
    runs: dict[str, dict[str, Any]] = {}
    for label, settings in RUNS:
        store_ssd = DRAM_ONLY_SSD if settings.get("policy.dram_only") else ssd
        store = EmbeddedStore(dram=dram, ssd=store_ssd, settings=settings, label=label)
        with store, kvstored.connect(store.address) as client:
            result = replay_trace(
                client, convo.trace, StorePolicy.from_config(store.config()),
                block_bytes=block_bytes, concurrency=concurrency, namespace=namespace,
                master=store.address, progress=None if progress is None else
                lambda n, total, label=label: progress(label, n, total))
        runs[label] = {"capacities": result.capacities.describe(), "run": result.run,
                       "model": result.model, "wrong_bytes": result.run.wrong_bytes,
                       "wrong_examples": result.document["wrong_examples"]}
    rounds = []
    for r in range(1, spec.rounds + 1):
        members = np.flatnonzero(convo.rounds == r)
        first, last = int(members[0]), int(members[-1]) + 1
        row: dict[str, Any] = {"round": r}
        for label, _ in RUNS:
            outcomes = runs[label]["run"].outcomes[first:last]
            row[label] = _round_summary(outcomes, prefill_tps)
            predicted = predicted_rates(runs[label]["model"], slice(first, last))
            for rate in ("hit_rate", "dram_hit_rate", "ssd_hit_rate"):
                row[label][f"predicted_{rate}"] = predicted[rate]
        rounds.append(row)
    return {
        "schema": SCHEMA,
        "spec": asdict(spec),
        "block_bytes": block_bytes,
        "dram_bytes": dram,
        "ssd_bytes": ssd,
        "overflow_round": spec.overflow_round if dram == default_dram else None,
        "prefill_tokens_per_s": prefill_tps,
        "requests": len(workload),
        "unique_blocks": convo.blocks_after[-1],
        "wrong_bytes": sum(r["wrong_bytes"] for r in runs.values()),
        "runs": {label: {"capacities": r["capacities"],
                         **_whole_run(r["run"].outcomes, r["model"]),
                         "wall_seconds": r["run"].wall_seconds,
                         "wrong_bytes": r["wrong_bytes"],
                         "wrong_examples": r["wrong_examples"]}
                 for label, r in runs.items()},
        "rounds": rounds,
    }
