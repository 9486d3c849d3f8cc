"""Verified weight sync: after every push the engine must serve the trainer's policy, or the run stops.

Invariant: when enabled (`engine.verify_sync`), every `WeightSync.push` ends in
`SyncProbe.after_push`, which sends the engine one fixed generation request (the same prompt
of at least `verify_prompt_tokens` tokens every push, a fixed seed, temperature 1) and
compares the log-probs the engine reports for the tokens it generated with the trainer's own
forward over prompt + generated (`sequence_logprobs`, the forward the loss takes, at the same
temperature). It passes when the largest |difference| is within the tolerance; otherwise it
re-pushes once and checks again, and a second failure raises SyncVerificationError with both
figures. Because the probe is a generation and its prompt's KV blocks were cached by the
previous push's probe, it catches a push that did not land and a prefix cache that was not
reset (prompt-logprob requests may bypass a prefix cache; generation does not). The request
carries its own seed, so the probe draws nothing from the engine's or torch's random
generators: a run's samples are the same with it as without it. Every result reaches the
sink (the run's trace) before any error is raised.

A remote engine's served weights must also change only by posttrain's pushes: `before_push`
(the start of every `WeightSync.push` to a remote engine) runs the probe again and compares
the engine's answer with the last verified one (same weights, same prompt, same seed: the same
log-probs within the tolerance over the tokens both answers share, at least the first); a
difference means another process changed what the engine serves (a reload through its control
plane, say), and SyncVerificationError stops
the run, naming both figures. The probe runs the same request at every push, so this costs one
probe generation a push.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from posttrain.configs.engine import EngineConfig
from posttrain.errors import ConfigError, SyncVerificationError
from posttrain.types import GenerationRequest, Message, SamplingParams

PROBE_SEED = 20_261_201
"""The probe request's seed (the same every push)."""
PROBE_TEMPERATURE = 1.0
"""The probe samples, and both sides score, at temperature 1: the policy itself."""
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
"""Default tolerance on |engine log-prob - trainer log-prob| by the trainer's dtype (float32:
30x what vLLM's CPU build showed against transformers, 3e-6)."""
_PASSAGE = (
    "Weight sync probe: the engine must serve the policy the trainer holds now, so every push "
    "is checked on this fixed text and the tokens the engine writes after it. 0123456789. "
)


class Scorer(Protocol):
    """The trainer's side of the probe (Trainer and its torchrun leader)."""

    def sequence_logprobs(
        self, prompt_ids: Sequence[int], token_ids: Sequence[int], temperature: float
    ) -> tuple[float, ...]: ...


@dataclass(frozen=True)
class ProbeResult:
    """One check: the engine version it checked, the tokens compared, the largest |difference| and
    both figures at that token, the tolerance, and whether it passed."""

    version: int
    tokens: int
    max_diff: float
    engine_logprob: float
    trainer_logprob: float
    position: int
    """Index (in the generated tokens) of the largest difference."""
    tolerance: float
    ok: bool
    seconds: float
    attempt: int
    """1: right after the push; 2: after the re-push a failed first check makes; 0: the check
    before a push that the engine still serves the last verified weights (`before_push`; its
    `trainer_logprob` is then the engine's own log-prob at that verified check)."""

    @property
    def message(self) -> str:
        if self.attempt == 0:  # before_push: the engine against its own verified answer
            verdict = "unchanged" if self.ok else "CHANGED without a push"
            return (
                f"served weights {verdict} since the check at engine version {self.version}: max |now - then| "
                f"log-prob {self.max_diff:.3g} over {self.tokens} tokens (tolerance {self.tolerance:g})"
            )
        verdict = "verified" if self.ok else "MISMATCH"
        return (
            f"weight sync {verdict} at engine version {self.version} (attempt {self.attempt}): "
            f"max |engine - trainer| log-prob {self.max_diff:.3g} over {self.tokens} generated tokens "
            f"(tolerance {self.tolerance:g}); at token {self.position}: engine {self.engine_logprob:.6f}, "
            f"trainer {self.trainer_logprob:.6f}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def enabled(cfg: EngineConfig, remote: bool) -> bool:
    """Whether pushes are verified: `on`, or `auto` with a remote engine (`WeightSync.remote`:
    the weights travel to another process)."""
    return cfg.verify_sync == "on" or (cfg.verify_sync == "auto" and remote)


def default_tolerance(dtype: str, precision: str = "float32", generates: str = "float32") -> float:
    """TOLERANCE of the loosest of the weights' dtype, the trainer's compute precision and the
    dtype the engine generates in (an hf engine's inference copy: `engine.generate_dtype`)."""
    names = [dtype.removeprefix("torch."), "bfloat16" if precision == "bf16_autocast" else "float32", generates]
    return max(TOLERANCE.get(n, TOLERANCE["bfloat16"]) for n in names)


def _engine_dtype(engine: Any) -> str:
    """The dtype an hf engine's inference copy generates in; float32 for any other engine."""
    from posttrain.engine.hf import generates_with

    kind = generates_with(engine)
    return "float32" if kind == "model" else kind


class SyncProbe:
    """Checks, after a push, that `engine` samples from `scorer`'s weights (module docstring)."""

    def __init__(
        self,
        cfg: EngineConfig,
        engine: Any,
        scorer: Scorer,
        remote: bool = True,
        tolerance: float | None = None,
        sink: Callable[[ProbeResult], object] | None = None,
    ) -> None:
        self.cfg, self.engine, self.scorer = cfg, engine, scorer
        self.enabled = enabled(cfg, remote)
        self.remote = remote
        self._tolerance = cfg.verify_tolerance or tolerance
        self.results: list[ProbeResult] = []
        """Every check made, in order."""
        self._sink = sink
        self._unsunk: list[ProbeResult] = []
        self._unreported: ProbeResult | None = None
        self._prompt: tuple[int, ...] | None = None
        self._busy = False
        self._verified: tuple[tuple[int, ...], tuple[float, ...], int] | None = None
        """The last passing check's generated tokens, the engine's log-probs of them, and its version."""

    @property
    def busy(self) -> bool:
        """Whether a check is under way (a re-push made by `after_push` runs inside one)."""
        return self._busy

    @property
    def tolerance(self) -> float:
        """engine.verify_tolerance, else the one given, else `default_tolerance` of the trainer's dtype
        and the engine's."""
        if self._tolerance is None:
            self._tolerance = default_tolerance(*_trainer_dtype(self.scorer), _engine_dtype(self.engine))
        return self._tolerance

    def attach(self, sink: Callable[[ProbeResult], object]) -> None:
        """Send every result to `sink` from now on (and the ones made before it was attached)."""
        self._sink = sink
        for result in self._unsunk:
            sink(result)
        self._unsunk.clear()

    def after_push(self, version: int, repush: Callable[[], int]) -> int:
        """`version` when the engine at it passes the check; else `repush()`'s version when that
        passes; else SyncVerificationError. The re-push's own call here returns at once."""
        if not self.enabled or self._busy:
            return version
        self._busy = True
        try:
            result = self.check(version)
            if not result.ok:
                version = repush()
                result = self.check(version, attempt=2)
        finally:
            self._busy = False
        if not result.ok:
            raise SyncVerificationError(
                f"{result.message}. After a re-push the engine still does not serve the trainer's policy "
                "(a push that did not land, a prefix cache not reset, or another model served); stopping"
            )
        return version

    def before_push(self) -> None:
        """Before a push to a remote engine: the engine still serves what the last passing check saw
        (module docstring), else SyncVerificationError. Nothing to compare before the first check."""
        if not (self.enabled and self.remote) or self._busy or self._verified is None:
            return
        tokens, logprobs, version = self._verified
        started = time.perf_counter()
        completion = self._generate()
        now = [float(x) for x in completion.logprobs]
        ids = tuple(completion.token_ids)
        shared = next((i for i, (a, b) in enumerate(zip(ids, tokens)) if a != b), min(len(ids), len(tokens)))
        # compared over the tokens both answers share (a near-tie may flip a later sampled token on
        # kernels that are not bit-deterministic); no shared token: nothing to compare, a change
        result = self._compare(version, now[:shared], list(logprobs[:shared]), started, attempt=0)
        same, worst, at = result.tokens > 0, result.max_diff, result.position
        self._record(result, report=False)
        if not result.ok:
            what = (
                f"max |now - then| log-prob {worst:.3g} (tolerance {self.tolerance:g}); at token {at}: now "
                f"{result.engine_logprob:.6f}, at the check {result.trainer_logprob:.6f}"
                if same
                else f"another first token: now {list(ids)}, at the check {list(tokens)}"
            )
            raise SyncVerificationError(
                f"the engine's served weights changed without a push from posttrain: its answer to the sync "
                f"probe at version {version} differs from the one verified after that push ({what}); another "
                "process reloaded or altered the engine; stopping"
            )

    def _generate(self) -> Any:
        params = SamplingParams(
            max_tokens=self.cfg.verify_tokens, temperature=PROBE_TEMPERATURE, top_p=1.0, n=1, seed=PROBE_SEED
        )
        return self.engine.generate([GenerationRequest(self.prompt(), params, request_id="sync-probe")])[0][0]

    def check(self, version: int, attempt: int = 1) -> ProbeResult:
        """Run the probe once against the engine as it is now."""
        started = time.perf_counter()
        prompt = self.prompt()
        completion = self._generate()
        engine_lp = [float(x) for x in completion.logprobs]
        trainer_lp = list(self.scorer.sequence_logprobs(prompt, completion.token_ids, PROBE_TEMPERATURE))
        result = self._compare(int(version), engine_lp, trainer_lp, started, attempt)
        self._record(result)
        # a failed check leaves nothing verified to compare with (the run stops on it anyway)
        self._verified = (tuple(completion.token_ids), tuple(engine_lp), int(version)) if result.ok else None
        return result

    def _compare(
        self, version: int, engine_lp: Sequence[float], trainer_lp: Sequence[float], started: float, attempt: int
    ) -> ProbeResult:
        """The probe's verdict on two log-prob sequences, token by token: the largest gap and where
        it is (a non-finite engine log-prob is an infinite gap; no token: nothing verified, a fail)."""
        diffs = [abs(a - b) if math.isfinite(a) else math.inf for a, b in zip(engine_lp, trainer_lp)]
        at = max(range(len(diffs)), key=diffs.__getitem__) if diffs else 0
        worst = diffs[at] if diffs else math.inf
        return ProbeResult(
            version=version,
            tokens=len(diffs),
            max_diff=worst,
            engine_logprob=engine_lp[at] if diffs else math.nan,
            trainer_logprob=trainer_lp[at] if diffs else math.nan,
            position=at,
            tolerance=self.tolerance,
            ok=worst <= self.tolerance,
            seconds=time.perf_counter() - started,
            attempt=attempt,
        )

    def prompt(self) -> tuple[int, ...]:
        """The probe's prompt: a fixed user message, repeated until the chat-rendered prompt has
        at least `verify_prompt_tokens` tokens (rendered once, then reused every push)."""
        if self._prompt is None:
            text = _PASSAGE
            ids = self.engine.encode_chat((Message("user", text),))
            while len(ids) < self.cfg.verify_prompt_tokens:
                text += _PASSAGE
                ids = self.engine.encode_chat((Message("user", text),))
            limit = _max_positions(self.scorer)
            if limit is not None and len(ids) + self.cfg.verify_tokens > limit:
                raise ConfigError(
                    f"engine.verify_prompt_tokens: the probe's {len(ids)}-token prompt and engine.verify_tokens "
                    f"({self.cfg.verify_tokens}) do not fit the model's {limit} positions"
                )
            self._prompt = tuple(ids)
        return self._prompt

    def row(self) -> dict[str, Any]:
        """The train row's view of the last check since the previous call ({} when none was made)."""
        r, self._unreported = self._unreported, None
        if r is None:
            return {}
        return {
            "sync_verified": r.ok,
            "sync_probe_max_diff": r.max_diff,
            "sync_probe_tokens": r.tokens,
            "sync_probe_s": round(r.seconds, 4),
            "sync_probe_attempts": r.attempt,
        }

    def _record(self, result: ProbeResult, report: bool = True) -> None:
        self.results.append(result)
        if report:
            self._unreported = result
        if self._sink is not None:
            self._sink(result)
        else:
            self._unsunk.append(result)


def _trainer_dtype(scorer: Any) -> tuple[str, str]:
    """(the dtype of the trainer's weights, its trainer.precision); float32 for a scorer without them."""
    model, config = getattr(scorer, "model", None), getattr(scorer, "config", None)
    params = model.parameters() if hasattr(model, "parameters") else iter(())
    first = next(iter(params), None)
    return str(first.dtype) if first is not None else "float32", str(getattr(config, "precision", "float32"))


def _max_positions(scorer: Any) -> int | None:
    """The trainer's model's position limit, which the served model shares (None when it has none)."""
    from posttrain.model.arch import position_limit

    return position_limit(getattr(getattr(scorer, "model", None), "config", None))
