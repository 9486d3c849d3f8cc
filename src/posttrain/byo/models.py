"""Model-based rewards: a local sequence-classification reward model, and an LLM judge
over the `openai` engine, with a score cache and a call log.

Invariant: a model-based score is a pure function of (prompt, completion,
answer, model version) as far as the cache can tell: a judge's scores are
cached per (prompt, completion, answer, judge version), where the version
hashes the model name, rubric, parse rule, scale and sampling, so a changed
rubric never reads an old score. The score is read only from the judge's
verdict tag, `<verdict id="NONCE">SCORE</verdict>`, where NONCE is drawn
fresh for each call after the completion exists and appears nowhere in the
completion, the prompt or the answer: a completion cannot supply the score
(not by being a number, nor by writing a verdict tag of its own, even when the
judge quotes it). A reply without exactly one such verdict, or with a score
out of range, is asked again with a fresh nonce (`retries` times); a judge
that still has none has answered without a verdict: an abstention, which is a
judgement (the judge read the answer and declined to grade it, as it may for
an empty answer), scored 0 with the reason `judge_abstained` and the part
`judge_abstained` 1, never masked (masking it would let a judge hide the
answers it would grade wrong, and let an answer that makes the judge decline
escape its negative reward). A judge that cannot be reached, answers an HTTP
error or times out raises VerifierError (infra, masked, counted), never reward
0. Every judge call, cached or not, is a row
of the `judge_calls` table in the cache database, keyed like the score, and
the rollout's trace row names that key in its `reason`. A pairwise judge asks
twice per completion, the completion first and then second (each order its own
key), and its reward is the completion's mean win over both orders; an ensemble's
reward is its members' mean. With `checks`, the reward is still the judge's: the
labels verifier's score of the same episode rides along as the part `programmatic`.
A pairwise judgement abstains when either order does; an ensemble counts an abstaining member
as 0 in its mean, its part `judge_abstained` is the share of members that abstained, and its
reason starts with `judge_abstained` when any did.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from posttrain.configs.byo import JudgeChecks, JudgeEnsembleParams, JudgeParams, RewardModelParams
from posttrain.domains.base import stable_hash
from posttrain.errors import ConfigError, GenerationError, VerifierError
from posttrain.types import Episode, Message, Score, Task


def _fill(template: str, task: Task, completion: str) -> str:
    prompt = "\n".join(m.content for m in task.prompt if m.role != "system")
    return (
        template.replace("{prompt}", prompt)
        .replace("{answer}", str(task.reference))
        .replace("{completion}", completion)
    )


# ---- reward model ---------------------------------------------------------------------

_MODELS: dict[str, tuple[Any, Any, threading.Lock]] = {}
_MODELS_LOCK = threading.Lock()


def _load_classifier(path: str) -> tuple[Any, Any, threading.Lock]:
    with _MODELS_LOCK:
        if path not in _MODELS:
            from transformers import AutoModelForSequenceClassification

            from posttrain.model.arch import load_tokenizer

            if not os.path.isfile(os.path.join(path, "config.json")):
                raise ConfigError(f"verifier reward_model: {path} is not a model directory (no config.json)")
            try:
                tok = load_tokenizer(path)
                model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"verifier reward_model: cannot load {path}: {exc}") from None
            _MODELS[path] = (model, tok, threading.Lock())
        return _MODELS[path]


class RewardModelVerifier:
    """Reward = the classifier's probability of the good label (sigmoid of the logit with one label)."""

    name = "reward_model"
    programmatic = False

    def __init__(self, params: RewardModelParams) -> None:
        self.params = params
        self.path = os.path.abspath(params.path)
        model, _, _ = _load_classifier(self.path)
        labels = int(model.config.num_labels)
        if labels > 1 and params.label >= labels:
            raise ConfigError(f"verifier reward_model: label {params.label} but the model has {labels} labels")
        self.version = f"{stable_hash(self.path, _weights_stamp(self.path), params.template, params.label):x}"[:10]

    def __getstate__(self) -> dict[str, Any]:
        return {"params": self.params, "path": self.path, "version": self.version}

    def rewards(self, texts: list[str]) -> list[float]:
        import torch

        model, tok, lock = _load_classifier(self.path)
        with lock, torch.no_grad():
            enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.params.max_length)
            logits_bl = model(**{k: v for k, v in enc.items() if k in ("input_ids", "attention_mask")}).logits.float()
        if logits_bl.shape[-1] == 1:
            return torch.sigmoid(logits_bl[:, 0]).tolist()
        return torch.softmax(logits_bl, dim=-1)[:, self.params.label].tolist()

    def score(self, task: Task, episode: Episode) -> Score:
        value = self.rewards([_fill(self.params.template, task, episode.completion)])[0]
        if not math.isfinite(value):
            raise VerifierError(f"reward model {self.path} returned {value}")
        ok = value >= self.params.pass_threshold
        return Score(value, {"outcome": value, "reward_model": value}, ok, "" if ok else "below threshold")

    def gold(self, task: Task) -> str | None:
        return str(task.reference)

    def wrong(self, task: Task) -> str:
        return ""


def _weights_stamp(path: str) -> str:
    files = sorted(p for p in Path(path).iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
    return ",".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in files)


# ---- judge cache --------------------------------------------------------------------------


def default_cache_path() -> Path:
    root = Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain"))
    return root / "judge.sqlite"


class JudgeCache:
    """SQLite (WAL): `scores` (key -> value, raw reply) and `judge_calls` (one row per call)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "PRAGMA synchronous=NORMAL"
            )  # WAL: a commit is durable at the next checkpoint, no fsync per call
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, version TEXT, value REAL, raw TEXT, "
                "created_at REAL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS judge_calls (id INTEGER PRIMARY KEY, key TEXT, version TEXT, task_id TEXT, "
                "cached INTEGER, value REAL, raw TEXT, error TEXT, latency_s REAL, request TEXT, created_at REAL)"
            )
            self._db.execute("CREATE INDEX IF NOT EXISTS judge_calls_key ON judge_calls(key)")
            self._db.commit()

    def get(self, key: str) -> tuple[float | None, str] | None:
        """The cached (value, raw reply) of `key` (value None: the judge abstained); None: not cached."""
        with self._lock:
            row = self._db.execute("SELECT value, raw FROM scores WHERE key=?", (key,)).fetchone()
        return None if row is None else (None if row[0] is None else float(row[0]), str(row[1]))

    def put(self, key: str, version: str, value: float | None, raw: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?)", (key, version, value, raw, time.time())
            )
            self._db.commit()

    def log(
        self,
        key: str,
        version: str,
        task_id: str,
        cached: bool,
        value: float | None,
        raw: str,
        error: str,
        latency_s: float,
        request: str,
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO judge_calls (key, version, task_id, cached, value, raw, error, latency_s, request, "
                "created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, version, task_id, int(cached), value, raw, error, latency_s, request, time.time()),
            )
            self._db.commit()

    def calls(self, key: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            self._db.row_factory = sqlite3.Row
            try:
                sql, args = (
                    ("SELECT * FROM judge_calls WHERE key=? ORDER BY id", (key,))
                    if key
                    else ("SELECT * FROM judge_calls ORDER BY id", ())
                )
                return [dict(r) for r in self._db.execute(sql, args)]
            finally:
                self._db.row_factory = None

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ---- judge ------------------------------------------------------------------------------------

VERDICT_PROTOCOL = "verdict-tag-1"
"""Named in the judge version, so scores parsed under another protocol are never reused."""
VERDICT_INSTRUCTION = (
    '\n\nEnd your reply with your score in exactly this form, once: <verdict id="{nonce}">SCORE</verdict>'
)
MAX_REPLY_CHARS = 20_000
"""Longest judge reply searched for its verdict; a longer one is cut to its last MAX_REPLY_CHARS."""


def new_nonce(*texts: str) -> str:
    """A fresh 64-bit hex nonce found in none of `texts`."""
    while True:
        nonce = secrets.token_hex(8)
        if not any(nonce in t for t in texts):
            return nonce


def verdict_body(reply: str, nonce: str) -> str:
    """The content of the reply's one verdict tag carrying `nonce`; VerifierError when
    there is none, or several that disagree."""
    found = re.findall(rf'<verdict id="{nonce}">(.*?)</verdict>', reply[-MAX_REPLY_CHARS:], re.DOTALL)
    bodies = {b.strip() for b in found}
    if not bodies:
        raise VerifierError(f"judge reply has no verdict tag with this call's id: {reply[-80:]!r}")
    if len(bodies) > 1:
        raise VerifierError(f"judge reply has {len(bodies)} different verdicts")
    return bodies.pop()


ABSTAINED = "judge_abstained"
"""The reason (and score part) of a judgement the judge answered without a verdict: scored 0."""

PAIRWISE_VERDICTS = {"A": 1.0, "TIE": 0.5, "B": 0.0}
"""A pairwise verdict as the first answer's win."""


class JudgeVerifier:
    """Asks an OpenAI-compatible server to grade the completion with the rubric; reward = score / scale
    (pointwise), or the completion's mean win against the reference answer over both orders (pairwise)."""

    name = "judge"
    programmatic = False

    def __init__(self, params: JudgeParams) -> None:
        self.params = params
        try:
            self.pattern = re.compile(params.score_pattern)
        except re.error as exc:
            raise ConfigError(f"verifier judge: score_pattern does not compile: {exc}") from None
        if self.pattern.groups < 1:
            raise ConfigError("verifier judge: score_pattern needs a group around the score")
        stamp = (
            VERDICT_PROTOCOL,
            params.model,
            params.rubric,
            params.score_pattern,
            params.scale,
            params.max_tokens,
            params.temperature,
            *(("pairwise",) if params.mode == "pairwise" else ()),
        )
        self.version = f"{stable_hash(*stamp):016x}"[:12]
        self.labels = labels_verifier(params.checks)
        self._engine: Any = None
        self._cache: JudgeCache | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"params": self.params}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["params"])  # type: ignore[misc]

    @property
    def cache(self) -> JudgeCache | None:
        c = self.params.cache
        if c is False:
            return None
        with self._lock:
            if self._cache is None:
                self._cache = JudgeCache(default_cache_path() if c is True else c)
            return self._cache

    def engine(self) -> Any:
        with self._lock:
            if self._engine is None:
                from posttrain.engine.openai import OpenAIEngine

                p = self.params
                self._engine = OpenAIEngine(
                    p.base_url, p.model, None, api_key=p.api_key, timeout_s=p.timeout_s, retries=p.retries
                )
            return self._engine

    def key(self, task: Task, completion: str, order: str = "") -> str:
        """The cache key of one judgement (`order`: which pairwise order, '' pointwise)."""
        blob = json.dumps([self.version, [m.content for m in task.prompt], str(task.reference), completion])
        return hashlib.sha256((blob + order).encode()).hexdigest()[:32]

    def parse(self, reply: str, nonce: str) -> float:
        """The reward in the reply's verdict tag for `nonce`: the first group of
        `score_pattern` inside the tag, over `scale` (pairwise: the first answer's win,
        A 1, TIE 0.5, B 0); VerifierError when there is no such tag or no score in range
        in it (text outside the tag is never read)."""
        body = verdict_body(reply, nonce)
        if self.params.mode == "pairwise":
            win = PAIRWISE_VERDICTS.get(body.strip().upper())
            if win is None:
                raise VerifierError(f"judge pairwise verdict is not A, B or TIE: {body[:80]!r}")
            return win
        m = self.pattern.search(body)
        if m is None:
            raise VerifierError(f"judge verdict has no score (pattern {self.params.score_pattern!r}): {body[:80]!r}")
        try:
            value = float(m.group(1))
        except (TypeError, ValueError):
            raise VerifierError(f"judge verdict score {m.group(1)!r} is not a number") from None
        if not 0.0 <= value <= self.params.scale:
            raise VerifierError(f"judge verdict score {value} is outside [0, {self.params.scale}]")
        return value / self.params.scale

    def score(self, task: Task, episode: Episode) -> Score:
        if self.params.mode == "pairwise":
            return with_shadow(self.labels, self._pairwise(task, episode.completion), task, episode)
        request = _fill(self.params.rubric, task, episode.completion)
        value, key, raw, cached = self._judged(task, self.key(task, episode.completion), request)
        if value is None:
            return with_shadow(self.labels, self._abstained(key, raw, cached), task, episode)
        return with_shadow(self.labels, self._verdict(value, key, raw, cached), task, episode)

    def _pairwise(self, task: Task, completion: str) -> Score:
        """The completion against the reference answer, in both orders (an abstention in either
        is the judgement's)."""
        reference = str(task.reference)
        first = self._judged(task, self.key(task, completion, "first"), self._fill_pair(task, completion, reference))
        second = self._judged(task, self.key(task, completion, "second"), self._fill_pair(task, reference, completion))
        for value, key, raw, cached in (first, second):
            if value is None:
                return self._abstained(key, raw, cached)
        assert first[0] is not None and second[0] is not None  # for the type checker: checked just above
        wins = (first[0], 1.0 - second[0])
        value = (wins[0] + wins[1]) / 2
        disagree = float(wins[0] != wins[1])
        ok = value >= self.params.pass_threshold
        why = (
            f"judge {self.version} pairwise keys {first[1]} {second[1]} wins {wins[0]:g}/{wins[1]:g}"
            f"{' (orders disagree)' if disagree else ''}"
        )
        parts = {"outcome": value, "judge": value, "swap_disagree": disagree, "judge_abstained": 0.0}
        return Score(value, parts, ok, why)

    def _fill_pair(self, task: Task, first: str, second: str) -> str:
        prompt = "\n".join(m.content for m in task.prompt if m.role != "system")
        return (
            self.params.rubric.replace("{prompt}", prompt)
            .replace("{answer}", str(task.reference))
            .replace("{first}", first)
            .replace("{second}", second)
        )

    def _judged(self, task: Task, key: str, request: str) -> tuple[float | None, str, str, bool]:
        """(value, key, raw reply, cached) of one judgement (value None: the judge abstained, a
        judgement cached like a score): from the cache, else asked. A judge that cannot be reached,
        answers an HTTP error or times out: VerifierError (infra)."""
        cache = self.cache
        hit = cache.get(key) if cache is not None else None
        if cache is not None and hit is not None:
            value, raw = hit
            cache.log(key, self.version, task.id, True, value, raw, "", 0.0, "")
            return value, key, raw, True
        t0, raw = time.perf_counter(), ""
        try:
            value, raw, request, why = self._ask(request)
        except GenerationError as exc:  # down, an HTTP error, a timeout: the judge service failed
            if cache is not None:
                cache.log(key, self.version, task.id, False, None, raw, str(exc), time.perf_counter() - t0, request)
            raise VerifierError(f"judge {self.params.base_url} ({self.params.model}): {exc}") from None
        if cache is not None:
            cache.put(key, self.version, value, raw)
            cache.log(key, self.version, task.id, False, value, raw, why, time.perf_counter() - t0, request)
        return value, key, raw, False

    def _ask(self, filled: str) -> tuple[float | None, str, str, str]:
        """(reward, reply, request, '') of the first reply with a valid verdict, asking up to
        1 + `retries` times, each with a fresh nonce; (None, last reply, its request, why) when
        no reply has one: the judge abstained. GenerationError (from the engine) when a call
        fails."""
        raw, request, why = "", filled, "judge: no call made"
        for _ in range(self.params.retries + 1):
            nonce = new_nonce(filled)
            request = filled + VERDICT_INSTRUCTION.format(nonce=nonce)
            raw = self.engine().chat(
                [Message("user", request)], self.params.max_tokens, self.params.temperature, seed=0
            )
            try:
                return self.parse(raw, nonce), raw, request, ""
            except VerifierError as exc:
                why = f"{ABSTAINED}: {exc}"
        return None, raw, request, why

    def _verdict(self, value: float, key: str, raw: str, cached: bool) -> Score:
        ok = value >= self.params.pass_threshold
        why = f"judge {self.version} key {key}{' cached' if cached else ''} reply {raw.strip()[:40]!r}"
        return Score(value, {"outcome": value, "judge": value, "judge_abstained": 0.0}, ok, why)

    def _abstained(self, key: str, raw: str, cached: bool) -> Score:
        """The score of a judgement without a verdict: 0, not passed, reason `judge_abstained`."""
        why = f"{ABSTAINED}: judge {self.version} key {key}{' cached' if cached else ''} reply {raw.strip()[:40]!r}"
        return Score(0.0, {"outcome": 0.0, "judge": 0.0, "judge_abstained": 1.0}, False, why)

    def gold(self, task: Task) -> str | None:
        return str(task.reference)

    def wrong(self, task: Task) -> str:
        return ""


class JudgeEnsemble:
    """Two or more judges: reward = their mean (an abstaining member counts 0); `agreement` = the
    share of member pairs whose pass/fail verdicts agree (1 when all agree); a member's infra
    failure is the ensemble's (infra)."""

    name = "judge_ensemble"
    programmatic = False

    def __init__(self, params: JudgeEnsembleParams) -> None:
        self.params = params
        self.members = [JudgeVerifier(p) for p in params.judges]
        self.version = f"{stable_hash(*(m.version for m in self.members)):016x}"[:12]
        self.labels = labels_verifier(params.checks)

    def score(self, task: Task, episode: Episode) -> Score:
        scores = [m.score(task, episode) for m in self.members]
        value = sum(s.value for s in scores) / len(scores)
        pairs = [(a, b) for i, a in enumerate(scores) for b in scores[i + 1 :]]
        agreement = sum(a.passed == b.passed for a, b in pairs) / len(pairs)
        abstained = sum(s.parts.get(ABSTAINED, 0.0) for s in scores) / len(scores)
        parts = {"outcome": value, "judge": value, "agreement": agreement, ABSTAINED: abstained}
        parts.update({f"judge_{i}": s.value for i, s in enumerate(scores)})
        swaps = [s.parts["swap_disagree"] for s in scores if "swap_disagree" in s.parts]
        if swaps:
            parts["swap_disagree"] = sum(swaps) / len(swaps)
        ok = value >= self.params.pass_threshold
        why = f"judge ensemble {self.version} agreement {agreement:.2f}: " + "; ".join(s.reason for s in scores)
        if abstained:
            why = f"{ABSTAINED} ({abstained:.2f} of the members): {why}"
        return with_shadow(self.labels, Score(value, parts, ok, why[:300]), task, episode)

    def gold(self, task: Task) -> str | None:
        return str(task.reference)

    def wrong(self, task: Task) -> str:
        return ""


def labels_verifier(checks: JudgeChecks | None) -> Any:
    """The programmatic verifier that labels a judge's items (None without checks); a verifier
    that is not programmatic (a judge, a reward model) cannot give labels: ConfigError."""
    if checks is None:
        return None
    from posttrain.byo.verifiers import build_verifier

    verifier = build_verifier(checks.labels)
    if not getattr(verifier, "programmatic", False):
        raise ConfigError(f"judge checks: labels verifier {checks.labels.name!r} is not programmatic")
    return verifier


def with_shadow(labels: Any, score: Score, task: Task, episode: Episode) -> Score:
    """`score` with the labels verifier's value on the same episode as the part `programmatic`."""
    if labels is None:
        return score
    shadow = labels.score(task, episode)
    return Score(score.value, {**score.parts, "programmatic": shadow.value}, score.passed, score.reason)
