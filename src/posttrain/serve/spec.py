"""Speculative decoding for the fast tier: drafts proposed cheaply, verified by the target.

Invariant: every emitted token is the token the target model itself would
choose at that position under the shared per-row sampler
(`posttrain.engine.sampling.sample_next`: greedy, or Gumbel-max with noise
that is a pure function of (row key, step, vocab index)). A draft token is
kept only when it equals that choice, so for the same weights, prompt,
sampling parameters and seed the output equals plain decoding, sampled rows
included, up to floating-point differences between a one-token and a
(k+1)-token forward. Drafts change speed, never the result.

Drafters: `SuffixDrafter` (no model: an adapter over engine/drafter.py's
`SuffixIndex`, the rollouts' own suffix matching, over the prompt, the output
so far and the past completions of the same prompt in a bounded `TaskStore`)
and `ModelDrafter` (a cheaper copy of the same weights, e.g. int8, run with its
own KV cache; its proposals use the same Gumbel noise as the target, so sampled
rows are accepted as often as greedy ones when the two distributions agree).
Each drafter's draft length adapts per sequence (engine/drafter.py
`DraftLength`: doubled after a draft accepted in full, halved after a
rejection, up to the drafter's most).
"""

from __future__ import annotations

import copy
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from posttrain.engine.base import Engine, text_chat
from posttrain.engine.drafter import DraftLength, SuffixIndex, TaskStore
from posttrain.engine.sampling import row_key, sample_next
from posttrain.engine.speculate import net_negative
from posttrain.errors import ConfigError, GenerationError
from posttrain.model.arch import position_limit
from posttrain.types import Completion, GenerationRequest, Message, SamplingParams

OnTokens = Callable[[int, int, Sequence[int]], None]
"""Streaming callback: (request index, sample index, new token ids)."""

Chooser = Callable[[torch.Tensor, int], tuple[int, float]]
"""(logits of one position (vocab,), generation step) -> (token id, log-prob)."""


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first `length` positions of a transformers DynamicCache."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def int8_copy(model: Any) -> Any:
    """A dynamically quantised (int8 Linear weights) copy of `model`; the
    original is untouched. Embeddings and norms stay float32."""
    clone = copy.deepcopy(model).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(clone, {torch.nn.Linear}, dtype=torch.qint8)


class Target(Protocol):
    """One sequence's view of the verifying model: a KV cache and a forward."""

    def forward(self, ids: Sequence[int]) -> torch.Tensor:
        """float32 logits (len(ids), vocab) of `ids` appended after the cached positions."""

    def truncate(self, length: int) -> None:
        """Keep the first `length` cached positions."""


class HFTarget:
    """A transformers causal LM with a DynamicCache (the standard tier's own module)."""

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache

        self.model, self.cache = model, DynamicCache(config=model.config)

    def forward(self, ids: Sequence[int]) -> torch.Tensor:
        out = self.model(input_ids=torch.tensor([list(ids)]), past_key_values=self.cache, use_cache=True)
        return out.logits[0].float()

    def truncate(self, length: int) -> None:
        crop_cache(self.cache, length)


class Drafter(Protocol):
    name: str
    stop_ids: set[int]
    """Token ids after which drafting stops (set by the engine: eos)."""

    def propose(self, ids: Sequence[int], k: int, choose: Chooser, step: int) -> list[int]:
        """Up to `k` guessed next tokens after `ids` (the prompt, then the `step` tokens
        generated so far); `step` is the generation step of the first guessed token."""

    def start(self, prompt: Sequence[int]) -> None:
        """Forget per-sequence state before a new sequence after `prompt`."""

    def finish(self, out: Sequence[int]) -> None:
        """The sequence ended having emitted `out` (a drafter that learns across requests keeps it)."""


class SuffixDrafter:
    """The model-free drafter: engine/drafter.py's suffix matching (the rollouts' own) over
    the sequence's prompt, its output as it grows, and the past completions of the same prompt
    that ended in this drafter (`store`, bounded: earlier requests and a request's earlier
    samples). A match shorter than `min_n` tokens is not drafted from (1-token matches are
    mostly noise); the longest suffix matched is `max_n` tokens."""

    name = "suffix"
    stop_ids: set[int] = set()

    def __init__(self, max_n: int = 8, min_n: int = 2, store: TaskStore | None = None) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"suffix match sizes: need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.store = store if store is not None else TaskStore(max_tasks=256, per_task=4)
        self._prompt: tuple[int, ...] = ()
        self._index = SuffixIndex((), max_n=max_n)
        self._own = self._index.add_sequence()
        self._indexed = 0
        """How many leading tokens of the sequence (prompt, then output) the index holds."""

    def start(self, prompt: Sequence[int]) -> None:
        self._prompt = tuple(prompt)
        self._index = SuffixIndex(self._prompt, max_n=self.max_n)
        for past in self.store.get(self._prompt):
            self._index.add_sequence(past)
        self._own = self._index.add_sequence()  # after the past ones: the latest occurrences
        self._indexed = len(self._prompt)

    def propose(self, ids: Sequence[int], k: int, choose: Chooser, step: int) -> list[int]:
        self._index.extend(self._own, ids[self._indexed :])  # the tokens verified since the last call
        self._indexed = len(ids)
        return self._index.propose(ids, k, min_n=self.min_n)

    def finish(self, out: Sequence[int]) -> None:
        self.store.add(self._prompt, out)


class ModelDrafter:
    """A draft model over the same vocabulary with its own KV cache, kept in
    sync with the sequence by cropping to the common prefix."""

    stop_ids: set[int] = set()

    def __init__(self, model: Any, name: str = "int8") -> None:
        self.model, self.name = model, name
        self.start(())

    def start(self, prompt: Sequence[int]) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.cached: list[int] = []

    def _common_prefix(self, ids: Sequence[int]) -> int:
        n = 0
        for a, b in zip(self.cached, ids):
            if a != b:
                break
            n += 1
        return min(n, len(ids) - 1)

    def propose(self, ids: Sequence[int], k: int, choose: Chooser, step: int) -> list[int]:
        keep = self._common_prefix(ids)
        crop_cache(self.cache, keep)
        feed = list(ids[keep:])
        self.cached = list(ids[:keep])
        out: list[int] = []
        for i in range(k):
            logits = self.model(input_ids=torch.tensor([feed]), past_key_values=self.cache, use_cache=True).logits
            self.cached.extend(feed)
            token, _ = choose(logits[0, -1].float(), step + i)
            out.append(token)
            if token in self.stop_ids:
                break
            feed = [token]
        return out

    def finish(self, out: Sequence[int]) -> None:
        return None


@dataclass
class DraftStats:
    """Counters of one drafter: proposed and accepted draft tokens, rounds, and per depth d
    (index d - 1) the drafts with a d-th token and those whose d-th token was accepted."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    """Tokens the verifying forwards emitted: the accepted ones, plus the target's own next
    token where it added one (none after an accepted end of sequence or at max_tokens)."""
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def accepted_len(self) -> float:
        """Tokens emitted per verifying forward of a draft: the accepted ones plus the token
        the target added after them, counted as emitted (so a draft ending in an accepted end
        of sequence counts its accepted tokens alone; it is not 1 + accepted / rounds)."""
        return self.emitted / self.rounds if self.rounds else 0.0

    def add(self, proposed: int, accepted: int, emitted: int | None = None) -> None:
        """One verified draft of `proposed` tokens, the first `accepted` accepted, `emitted`
        tokens out of its forward (None: accepted + 1, the target's next token after them)."""
        self.rounds, self.proposed, self.accepted = self.rounds + 1, self.proposed + proposed, self.accepted + accepted
        self.emitted += accepted + 1 if emitted is None else emitted
        grow = proposed - len(self.proposed_at)
        if grow > 0:
            self.proposed_at += [0] * grow
            self.accepted_at += [0] * grow
        for d in range(proposed):
            self.proposed_at[d] += 1
        for d in range(accepted):
            self.accepted_at[d] += 1


@dataclass
class SpecStats:
    """Decoding counters: target forwards, emitted tokens, per-drafter stats."""

    target_forwards: int = 0
    tokens: int = 0
    drafters: dict[str, DraftStats] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "target_forwards": self.target_forwards,
            "tokens": self.tokens,
            "tokens_per_forward": self.tokens / self.target_forwards if self.target_forwards else 0.0,
            "drafters": {
                n: {
                    "proposed": s.proposed,
                    "accepted": s.accepted,
                    "acceptance": s.acceptance,
                    "accepted_len": s.accepted_len,
                    "acceptance_at": [a / p if p else 0.0 for a, p in zip(s.accepted_at, s.proposed_at)],
                }
                for n, s in self.drafters.items()
            },
        }


def _chooser(params: SamplingParams, key: int) -> Chooser:
    temp = torch.tensor([params.temperature], dtype=torch.float32)
    top_p = torch.tensor([params.top_p], dtype=torch.float32)
    keys = torch.tensor([key], dtype=torch.int64)

    def choose(logits_v: torch.Tensor, step: int) -> tuple[int, float]:
        token_b, logprob_b = sample_next(logits_v[None, :].float(), temp, top_p, keys, step)
        return int(token_b[0]), float(logprob_b[0])

    return choose


@dataclass
class _Seq:
    """The state of one sequence being decoded."""

    prompt: list[int]
    max_tokens: int
    greedy: bool = False
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""
    stop_hit: bool = False
    tried: dict[str, DraftStats] = field(default_factory=dict)
    """Per drafter, its counters in this sequence alone."""
    spent: dict[str, float] = field(default_factory=dict)
    """Per drafter, in this sequence: seconds its rounds took (drafting, the verifying forward)."""
    lengths: dict[str, DraftLength] = field(default_factory=dict)
    """Per drafter, its adaptive draft length in this sequence."""


class SpeculativeEngine(Engine):
    """The Engine contract, decoding one sequence at a time (latency first)
    with draft proposals verified by `model`.

    `drafters` are tried in order each round; the first non-empty proposal
    is verified. `draft_tokens` holds each drafter's most tokens per draft
    (default 10 for the suffix drafter, 5 for others); within a sequence each
    drafter's length adapts (`DraftLength`: starts at 4 or its most if less).
    With no drafters this is plain KV-cache decoding."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        drafters: Sequence[Drafter] = (),
        draft_tokens: Sequence[int] | None = None,
        version: int = 0,
        target: Callable[[], Target] | None = None,
        model_draft_after: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model_draft_after = model_draft_after
        self.clock = clock
        """What rounds are timed with (`_paying`); a test may freeze it."""
        self.plain_s = 0.0
        """Running mean seconds of a plain one-token step (a forward without a draft), 0 before one."""
        self.model, self.tokenizer = model.eval(), tokenizer
        self.new_target: Callable[[], Target] = target or (lambda: HFTarget(self.model))
        self.drafters = list(drafters)
        self.draft_tokens = (
            list(draft_tokens) if draft_tokens is not None else [10 if d.name == "suffix" else 5 for d in self.drafters]
        )
        if len(self.draft_tokens) != len(self.drafters):
            raise ValueError("draft_tokens: need one draft length per drafter")
        self.version = version
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.stats = SpecStats(drafters={d.name: DraftStats() for d in self.drafters})
        for d in self.drafters:
            d.stop_ids = {self.eos_token_id}
        self._lock = threading.Lock()

    # -- Engine contract -------------------------------------------------
    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return encode_chat(self.tokenizer, messages)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def update_weights(self, source: Any) -> int:
        raise GenerationError(
            "SpeculativeEngine.update_weights: rebuild the fast tier from the new weights instead (serve.tiers)"
        )

    def generate(
        self, requests: Sequence[GenerationRequest], on_tokens: OnTokens | None = None
    ) -> list[list[Completion]]:
        results = []
        with self._lock, torch.inference_mode():
            for r_idx, req in enumerate(requests):
                seed = req.params.seed if req.params.seed is not None else secrets.randbits(63)
                group = []
                for s_idx in range(req.params.n):
                    emit = (lambda ids, r=r_idx, s=s_idx: on_tokens(r, s, ids)) if on_tokens else None
                    group.append(self._one(req, row_key(seed, s_idx), emit))
                results.append(group)
        return results

    # -- decoding --------------------------------------------------------
    def _one(self, req: GenerationRequest, key: int, emit: Callable[[Sequence[int]], None] | None) -> Completion:
        if not req.prompt_ids:
            raise GenerationError("prompt_ids: empty prompt")
        limit = position_limit(self.model.config)  # max_position_embeddings, RoPE scaling's factor included
        room = req.params.max_tokens if limit is None else min(req.params.max_tokens, limit - len(req.prompt_ids))
        if room < 1:
            raise ConfigError(
                f"prompt_ids has {len(req.prompt_ids)} tokens; the model's max_position_embeddings is {limit}, leaving "
                "no room to generate"
            )
        seq = _Seq(prompt=list(req.prompt_ids), max_tokens=room, greedy=req.params.temperature <= 0)
        seq.lengths = {d.name: DraftLength(k) for d, k in zip(self.drafters, self.draft_tokens)}
        choose = _chooser(req.params, key)
        cache = self.new_target()
        if len(seq.prompt) > 1:
            self._forward(seq.prompt[:-1], cache)
        for d in self.drafters:
            d.start(seq.prompt)
        last = seq.prompt[-1]
        while not seq.finish:
            t0 = self.clock()
            draft, drafter = self._draft(seq, choose)
            t1 = self.clock()
            logits = self._forward([last] + draft, cache)
            new = self._verify(seq, logits, draft, choose)
            accepted = self._append(seq, new, req.params)
            if drafter is not None:
                self._count(seq, drafter.name, draft, new, len(accepted))
                seq.spent[drafter.name] = seq.spent.get(drafter.name, 0.0) + self.clock() - t0
            else:  # a plain step: what drafting must beat (the failed draft attempts not counted)
                step = self.clock() - t1
                self.plain_s = step if self.plain_s <= 0 else self.plain_s + 0.2 * (step - self.plain_s)
            if emit and accepted:
                emit(accepted)
            last = seq.out[-1] if seq.out else last
            cache.truncate(len(seq.prompt) + len(seq.out) - 1)
        for d in self.drafters:
            d.finish(seq.out)
        self.stats.tokens += len(seq.out)
        return Completion(
            prompt_ids=tuple(seq.prompt),
            token_ids=tuple(seq.out),
            text=self._text(seq, req.params.stop),
            logprobs=tuple(seq.logprobs),
            finish_reason=seq.finish,  # type: ignore[arg-type]
            model_version=self.version,
        )

    def _text(self, seq: _Seq, stop: Sequence[str]) -> str:
        """The completion's text: without a final eos, cut before a stop string."""
        body = seq.out[:-1] if seq.out and seq.out[-1] == self.eos_token_id else seq.out
        text = self.decode(body)
        if seq.stop_hit:
            text = text[: min((text.find(s) for s in stop if s in text), default=len(text))]
        return text

    def _count(self, seq: _Seq, name: str, draft: list[int], new: list[tuple[int, float]], emitted: int) -> None:
        matched = 0
        while matched < min(len(draft), len(new)) and new[matched][0] == draft[matched]:
            matched += 1
        self.stats.drafters[name].add(len(draft), matched, emitted)
        seq.tried.setdefault(name, DraftStats()).add(len(draft), matched, emitted)
        seq.lengths[name].update(len(draft), matched)

    def _paying(self, seq: _Seq, name: str) -> bool:
        """A drafter keeps drafting for a sequence for its first 4 rounds; after them, while its
        rounds emitted at least as many tokens as the plain steps their time would have paid for
        (tokens per round against a round's time over a plain step's: `speculate.net_negative`,
        the rollouts' auto-off rule), or, before a plain step was timed, while at least a fifth of
        its drafted tokens were accepted."""
        mine = seq.tried.get(name)
        if mine is None or mine.rounds < 4:
            return True
        if self.plain_s > 0:
            return not net_negative(mine.accepted_len, seq.spent.get(name, 0.0) / mine.rounds, self.plain_s)
        return mine.accepted * 5 >= mine.proposed

    def _forward(self, ids: list[int], cache: Target) -> torch.Tensor:
        self.stats.target_forwards += 1
        logits = cache.forward(ids)
        if not bool(torch.isfinite(logits).all()):
            raise GenerationError("target model produced non-finite logits (broken weights?)")
        return logits

    def _draft(self, seq: _Seq, choose: Chooser) -> tuple[list[int], Drafter | None]:
        room = seq.max_tokens - len(seq.out)
        if room <= 1:
            return [], None
        ids = seq.prompt + seq.out
        for drafter in self.drafters:
            if not self._paying(seq, drafter.name):
                continue
            if drafter.name not in ("suffix", "head") and len(seq.out) < self.model_draft_after:
                continue  # a draft model's own prompt prefill only pays off on longer answers (the head has none)
            k = seq.lengths[drafter.name].value
            draft = drafter.propose(ids, min(k, room - 1), choose, len(seq.out))
            if self.eos_token_id in draft:  # nothing after an end of sequence can be accepted
                draft = draft[: draft.index(self.eos_token_id) + 1]
            if draft:
                return draft, drafter
        return [], None

    def _verify(self, seq: _Seq, logits: torch.Tensor, draft: list[int], choose: Chooser) -> list[tuple[int, float]]:
        """Target choices position by position, up to and including the first
        one that differs from the draft (or one past the last draft token)."""
        new: list[tuple[int, float]] = []
        if seq.greedy:  # one argmax and one log-softmax for all positions (the same per-row math)
            n = len(draft) + 1
            tokens = logits[:n].argmax(dim=-1)
            logps = torch.log_softmax(logits[:n], dim=-1).gather(-1, tokens[:, None])[:, 0]
            pairs = list(zip(tokens.tolist(), logps.tolist()))
        for i in range(len(draft) + 1):
            token, logprob = pairs[i] if seq.greedy else choose(logits[i], len(seq.out) + i)
            new.append((token, logprob))
            if i >= len(draft) or token != draft[i] or token == self.eos_token_id:
                break
        return new

    def _append(self, seq: _Seq, new: list[tuple[int, float]], params: SamplingParams) -> list[int]:
        """Append verified tokens, stopping at eos, max_tokens or a stop string."""
        added = []
        for token, logprob in new:
            seq.out.append(token)
            seq.logprobs.append(logprob)
            added.append(token)
            if token == self.eos_token_id:
                seq.finish = "stop"
            elif params.stop and _hits_stop(self.decode(seq.out), params.stop):
                seq.finish, seq.stop_hit = "stop", True
            elif len(seq.out) >= params.max_tokens:
                seq.finish = "length"
            if seq.finish:
                break
        return added


def _hits_stop(text: str, stops: Sequence[str]) -> bool:
    return any(s and s in text for s in stops)


def encode_chat(tokenizer: Any, messages: Sequence[Message]) -> tuple[int, ...]:
    """Chat messages rendered by the tokenizer's template, assistant turn opened (ConfigError for
    a message with images: `engine.base.text_chat`)."""
    rendered = tokenizer.apply_chat_template(text_chat(messages), add_generation_prompt=True, tokenize=True)
    ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
    return tuple(int(i) for i in ids)
