"""Held-out evaluation per domain: seeded, greedy, reproducible, with intervals.

Invariant: the same model and held-out set give the same JSON twice (greedy
decoding; sampled metrics use a fixed seed); only eval-split tasks are used;
each item is scored by its domain's training verifier and by its eval
verifier (`strict.py`: the training verdict AND the domain's stricter
checks). Each item's group runs through the training lifecycle
(`pipeline.group.GroupRun` under `pipeline.play.Play`): the run's budgets,
retries, generation batching (a failing engine call is split down to the group
that failed it: one prompt too long masks only its own item) and execute caps
(`EvalOptions`), with what escapes the execute step or the verifier blamed by its
cause (`judge`): an infra error (a verifier that raises on the gold answer too is
one) is counted and left out of every accuracy, never a 0 (a domain of infra
errors only has accuracy None); a model fault is a wrong answer (scored 0). A
multi-turn domain (one with an environment) is evaluated as it is trained: each
item an episode played to its end through `envs.driver`, its turn count kept, so
pass@turn-k (passed using at most k turns) is reported per turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, cast

from posttrain.configs.tasks import DomainSpec
from posttrain.domains.base import Budget, extract_answer
from posttrain.domains.registry import get
from posttrain.engine.base import Engine
from posttrain.errors import ErrorKind, ErrorRecord, capture
from posttrain.evaluate.heldout import DomainSet, HeldoutSet, build_heldout
from posttrain.evaluate.stats import maj_at_k, mean_interval, mean_over_domains_interval, pass_at_k, wilson
from posttrain.evaluate.strict import checks_of, eval_verifier_name
from posttrain.pipeline.budget import domain_budget, execute_of
from posttrain.pipeline.group import GroupRun, RetryPolicy
from posttrain.pipeline.play import Play
from posttrain.pipeline.workers import Verdict
from posttrain.types import Episode, SamplingParams, Task

Item = tuple[str, "bool | None", "bool | None"]  # task id, eval verdict, training verdict (None: infra error)


class ItemSample(NamedTuple):
    """One item's greedy completion as the evaluation saw it (`DomainResult.samples`): what the
    report's sample table shows. `value`: the training score (None: an infra error); `ok`: the
    eval verdict; `error`: why the item is an infra error or a model fault ("" otherwise);
    `images`: the sha256 of each image of the prompt, in order (empty for text), by which the
    report draws them again (report/taskimages.py)."""

    task_id: str
    prompt: str
    completion: str
    value: float | None
    ok: bool | None
    error: str = ""
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvalOptions:
    """How items are decoded and which sampled metrics are computed."""

    max_tokens: int | None = None
    """A cap over every domain's tokens (None: no cap)."""
    budgets: Mapping[str, int] = field(default_factory=dict)
    """Tokens per domain, as in training; a domain not named uses its declared budget."""
    turns: Mapping[str, int] = field(default_factory=dict)
    """Turns per multi-turn domain, as in training; a domain not named uses its declared budget."""
    seconds: Mapping[str, float] = field(default_factory=dict)
    """Seconds per episode of a multi-turn domain, as in training (`max_seconds`); a domain not
    named uses its declared budget."""
    batch_size: int = 256
    samples: int = 0
    temperature: float = 1.0
    ks: tuple[int, ...] = ()
    seed: int = 0
    policy: RetryPolicy = RetryPolicy()
    """The run's retry policy (`RetryPolicy.of(pipeline)`; default: the pipeline's defaults)."""
    sandbox: Any = None
    """The run's `sandbox` section: programs run under its caps (max_memory_mb, max_wall_s) and
    each domain's budget seconds, as in training (None: the pool as configured, no caps but the
    budget seconds)."""
    progress: bool = False
    """A bar on stderr (plain lines off a terminal, posttrain/progress.py) counting the samples
    generated, batch by batch as the engine finishes them; an episode's later turns raise its
    total as they come (a failed engine call counts nothing)."""


@dataclass(frozen=True)
class DomainResult:
    """One domain's held-out figures. `n` is the number of distinct tasks in its set;
    accuracies are over the `scored` ones (n minus infra errors)."""

    domain: str
    difficulty: int
    n: int
    accuracy: float | None
    mean_score: float | None = None
    infra_errors: int = 0
    low: float = 0.0
    high: float = 1.0
    train_accuracy: float | None = None
    eval_verifier: str = ""
    requested: int = 0
    kind: str = "core"
    sampling: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    """`pass@k` / `maj@k` -> (value, low, high), over the items sampled."""
    items: tuple[Item, ...] = ()
    turns: tuple[int, ...] = ()
    """Multi-turn domains: turns each item's episode used (same order as `items`); empty otherwise."""
    turn_budget: int = 0
    """Multi-turn domains: the turn budget the episodes ran with (0: single-turn)."""
    stops: tuple[tuple[int, int] | None, ...] = ()
    """Domains whose scores carry the parts `stopped` and `infeasible` (an honest stop is part of
    the task, docs/feedback.md): (stopped, infeasible) per item, same order as `items`, None for an
    item without them (an infra error); empty for other domains."""
    samples: tuple[ItemSample, ...] = ()
    """Each item's prompt and greedy completion, same order as `items`, as measured (not in
    `to_json`: eval.json keeps verdicts only; `RunEvaluator` writes these to eval_samples.jsonl)."""
    sampling_items: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """The per-item values behind `sampling`: item id -> metric -> that item's value (its share of
    samples passed within t turns, its pass@k estimate, ...), for the items sampled; the intervals
    of `sampling` are over these, and another interval (a bootstrap over items) can be taken from them."""

    @property
    def stop_rates(self) -> dict[str, tuple[float, float, float, int]]:
        """ "infeasible" / "feasible" -> (share of those scored items whose episode ended in a stop,
        95% Wilson low, high, items): the stop rate where the task cannot be met (the right call)
        and where it can (a give-up). Empty for a domain without stop parts."""
        out = {}
        for label, want in (("infeasible", 1), ("feasible", 0)):
            rows = [
                s for s, (_, ok, _) in zip(self.stops, self.items) if s is not None and ok is not None and s[1] == want
            ]
            hits = sum(s[0] for s in rows)
            out[label] = (hits / len(rows) if rows else 0.0, *wilson(hits, len(rows)), len(rows))
        return out if any(s is not None for s in self.stops) else {}

    @property
    def pass_at_turn(self) -> dict[int, tuple[float, float, float]]:
        """k -> (share of scored items passed within k turns, 95% Wilson low, high), k = 1..turn budget."""
        scored = [(ok, n) for (_, ok, _), n in zip(self.items, self.turns) if ok is not None]
        out = {}
        for k in range(1, self.turn_budget + 1):
            hits = sum(bool(ok) and n <= k for ok, n in scored)
            out[k] = (hits / len(scored) if scored else 0.0, *wilson(hits, len(scored)))
        return out if scored else {}

    @property
    def turn_gain(self) -> dict[int, tuple[float, float, float, int]]:
        """k -> (pass@turn-k minus pass@turn-(k-1), 95% Wilson low, high, items), k = 2..turn budget:
        the share of scored items whose episode passed at turn k exactly (a failed turn k-1 that
        the revision converted). The two pass rates are of the same episodes, so their difference
        is itself a proportion of items and its interval is that proportion's (above 0 exactly when
        at least one item converted at turn k). Empty for a single-turn domain."""
        scored = [(ok, n) for (_, ok, _), n in zip(self.items, self.turns) if ok is not None]
        out = {}
        for k in range(2, self.turn_budget + 1):
            hits = sum(bool(ok) and n == k for ok, n in scored)
            out[k] = (hits / len(scored) if scored else 0.0, *wilson(hits, len(scored)), hits)
        return out if scored else {}

    @property
    def scored(self) -> int:
        return self.n - self.infra_errors

    @property
    def verdicts(self) -> dict[str, bool | None]:
        return {tid: ok for tid, ok, _ in self.items}

    def to_json(self) -> dict:
        return {
            "domain": self.domain,
            "difficulty": self.difficulty,
            "kind": self.kind,
            "requested": self.requested,
            "n": self.n,
            "scored": self.scored,
            "infra_errors": self.infra_errors,
            "accuracy": self.accuracy,
            "ci": [self.low, self.high],
            "train_accuracy": self.train_accuracy,
            "mean_score": self.mean_score,
            "eval_verifier": self.eval_verifier,
            "sampling": {k: list(v) for k, v in self.sampling.items()},
            **({"sampling_items": {t: dict(m) for t, m in self.sampling_items.items()}} if self.sampling_items else {}),
            "items": [list(i) for i in self.items],
            **self._turns_json(),
        }

    def _turns_json(self) -> dict:
        if not self.turn_budget:
            return {}
        out = {
            "turn_budget": self.turn_budget,
            "turns": list(self.turns),
            "pass_at_turn": {str(k): list(v) for k, v in self.pass_at_turn.items()},
            "turn_gain": {str(k): list(v) for k, v in self.turn_gain.items()},
        }
        if self.stops:
            out["stops"] = [list(s) if s is not None else None for s in self.stops]
            out["stop_rate"] = {k: list(v) for k, v in self.stop_rates.items()}
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> DomainResult:
        low, high = d.get("ci", (0.0, 1.0))
        figures = (d["accuracy"], d.get("mean_score"), d.get("infra_errors", 0), low, high, d.get("train_accuracy"))
        labels = (d.get("eval_verifier", ""), d.get("requested", d["n"]), d.get("kind", "core"))
        sampling = {k: tuple(v) for k, v in d.get("sampling", {}).items()}
        items = tuple((i[0], i[1], i[2]) for i in d.get("items", ()))
        stops = tuple((s[0], s[1]) if s is not None else None for s in d.get("stops", ()))
        turns = (tuple(d.get("turns", ())), d.get("turn_budget", 0))
        per_item = {t: dict(m) for t, m in d.get("sampling_items", {}).items()}
        return cls(
            d["domain"],
            d["difficulty"],
            d["n"],
            *figures,
            *labels,
            sampling,
            items,
            *turns,
            stops,
            sampling_items=per_item,
        )

    def head(self, m: int) -> DomainResult:
        """This result restricted to its first m items (the fixed subset), figures recomputed."""
        first = (self.domain, self.difficulty, self.kind, min(self.requested, m), self.eval_verifier, self.items[:m])
        return _result(*first, [], None, self.turns[:m], self.turn_budget, self.stops[:m], self.samples[:m])


def _result(
    domain: str,
    level: int,
    kind: str,
    requested: int,
    verifier: str,
    items: Sequence[Item],
    values: Sequence[float],
    sampling: Mapping[str, tuple[float, float, float]] | None = None,
    turns: Sequence[int] = (),
    turn_budget: int = 0,
    stops: Sequence[tuple[int, int] | None] = (),
    samples: Sequence[ItemSample] = (),
    sampling_items: Mapping[str, Mapping[str, float]] | None = None,
) -> DomainResult:
    ok = [v for _, v, _ in items if v is not None]
    train = [t for _, _, t in items if t is not None]
    k = sum(ok)
    acc = k / len(ok) if ok else None
    low, high = wilson(k, len(ok))
    mean, train_acc = sum(values) / len(values) if values else None, sum(train) / len(train) if train else None
    figures = (acc, mean, len(items) - len(ok), low, high, train_acc, verifier, requested, kind)
    kept_stops = tuple(stops) if any(x is not None for x in stops) else ()
    rest = (dict(sampling or {}), tuple(items), tuple(turns), turn_budget, kept_stops, tuple(samples))
    return DomainResult(domain, level, len(items), *figures, *rest, dict(sampling_items or {}))


@dataclass(frozen=True)
class EvalTable:
    """One evaluation: core results per domain, generalisation probes and the rotation slice apart."""

    model_version: int
    results: Mapping[str, DomainResult] = field(default_factory=dict)
    probes: Mapping[str, DomainResult] = field(default_factory=dict)
    """`above:DOMAIN` and `transfer:DOMAIN` results."""
    rotation: Mapping[str, DomainResult] = field(default_factory=dict)
    heldout_version: str = ""

    @property
    def accuracies(self) -> dict[str, float]:
        """Domain -> accuracy, for the domains that have one (infra-only domains left out)."""
        return {k: r.accuracy for k, r in self.results.items() if r.accuracy is not None}

    @property
    def counts(self) -> dict[str, int]:
        """Domain -> how many scored items its accuracy rests on (distinct tasks less infra errors)."""
        return {k: r.n - r.infra_errors for k, r in self.results.items() if r.accuracy is not None}

    @property
    def mean_accuracy(self) -> float:
        vals = list(self.accuracies.values())
        return sum(vals) / len(vals) if vals else 0.0

    def mean_interval(self, seed: int = 0) -> tuple[float, float]:
        outcomes = {k: [bool(v) for _, v, _ in r.items if v is not None] for k, r in self.results.items()}
        if not any(outcomes.values()):  # an older table without items: Wilson of the pooled counts
            return (0.0, 1.0)
        return mean_over_domains_interval(outcomes, seed)

    def head(self, m: int) -> EvalTable:
        """The fixed subset: every core result restricted to its first m items."""
        return replace(self, results={k: r.head(m) for k, r in self.results.items()}, probes={}, rotation={})

    def to_json(self) -> dict:
        lo, hi = self.mean_interval()
        return {
            "model_version": self.model_version,
            "heldout_version": self.heldout_version,
            "mean_accuracy": self.mean_accuracy,
            "mean_ci": [lo, hi],
            "domains": {k: r.to_json() for k, r in self.results.items()},
            "probes": {k: r.to_json() for k, r in self.probes.items()},
            "rotation": {k: r.to_json() for k, r in self.rotation.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping) -> EvalTable:
        def rs(key: str) -> dict[str, DomainResult]:
            return {k: DomainResult.from_json(v) for k, v in (data.get(key) or {}).items()}

        return cls(data["model_version"], rs("domains"), rs("probes"), rs("rotation"), data.get("heldout_version", ""))


# ---------------------------------------------------------------- running an evaluation


def eval_tasks(domain: str, difficulty: int, n: int) -> list[Task]:
    """Up to n distinct eval tasks of a domain at a level (the core set with seed 0)."""
    from posttrain.evaluate.heldout import domain_set

    return domain_set(domain, difficulty, n, "core").tasks()


def tokens_for(domain: str, opts: EvalOptions) -> int:
    """A domain's eval token budget: the training one, capped by `opts.max_tokens`."""
    return eval_budgets([domain], opts)[domain].tokens


def eval_budgets(domains: Iterable[str], opts: EvalOptions) -> dict[str, Budget]:
    """Each domain's eval budget by the one budget rule (`pipeline.budget.domain_budget`): the
    training one (tokens capped by `opts.max_tokens`, turns, seconds per episode)."""
    spec = lambda d: DomainSpec(  # noqa: E731 - the tasks.domains budget fields as the options carry them
        max_tokens=opts.budgets.get(d) or None,
        max_turns=opts.turns.get(d) or None,
        max_seconds=opts.seconds.get(d) or None,
    )
    return {d: domain_budget(get(d), spec(d), opts.max_tokens) for d in set(domains)}


def _groups(
    engine: Engine,
    tasks: Sequence[Task],
    params: SamplingParams,
    batch_size: int,
    opts: EvalOptions,
    desc: str = "eval",
) -> list[GroupRun]:
    """Every task's group (`params.n` samples), in task order, through the one lifecycle
    (`pipeline.play.Play`: the training budgets, retries, execute caps and masking; single-turn
    tasks generated in batches by token budget, multi-turn ones played as episodes), verified;
    with `opts.progress`, on a bar named `desc`."""
    from posttrain.progress import progress

    budgets = eval_budgets((t.domain for t in tasks), opts)
    execute = execute_of(opts.sandbox, budgets)
    rows = len(tasks) * params.n
    with progress(rows, desc, unit="samples", disable=not opts.progress, leave=False) as bar:
        return Play(engine, params, budgets, opts.policy, batch_size, execute, progress=bar).run(tasks)


class ItemVerdict(NamedTuple):
    """One item's verdicts: the eval one (strict), the training one and the training score; each
    None where the item is an infra error (never a wrong answer), whose captured record is `error`."""

    ok: bool | None
    train_ok: bool | None
    value: float | None
    error: ErrorRecord | None = None


def judge(task: Task, verdict: Verdict, episode: Episode) -> ItemVerdict:
    """The item's verdicts from its training verdict (`GroupRun`: blamed by cause, transient
    verifier failures retried): an infra error leaves the item out, a model fault is a wrong
    answer (0); the eval verdict then ANDs the domain's stricter checks, and a check that
    raises is captured (infra for the eval verdict only)."""
    if verdict.score is None:  # an infra error: never a wrong answer
        return ItemVerdict(None, None, None, ErrorRecord(cast(ErrorKind, verdict.error_kind), verdict.error or ""))
    if verdict.fault is not None:
        return ItemVerdict(False, False, 0.0, ErrorRecord("model", verdict.fault))
    ok, score = bool(verdict.score.passed), verdict.score
    try:
        strict = ok and all(bool(check(task, episode.completion)) for _, check in checks_of(get(task.domain)))
    except Exception as exc:  # the stricter check could not decide: infra for the eval verdict only
        return ItemVerdict(None, ok, float(score.value), capture(exc, "verifier"))
    return ItemVerdict(strict, ok, float(score.value))


def _judged(run: GroupRun) -> list[ItemVerdict]:
    """A verified group's items' verdicts, sample by sample."""
    assert run.result is not None  # `Play.run` finished it
    episodes = run.episodes or [Episode(r.completion.text) for r in run.result.rollouts]
    return [judge(run.task, v, e) for v, e in zip(run.final, episodes)]


def _stop(verdict: Verdict) -> tuple[int, int] | None:
    """(stopped, infeasible) of a sample's score, from its parts; None without them."""
    parts = verdict.score.parts if verdict.score is not None else {}
    ok = "stopped" in parts and "infeasible" in parts
    return (int(parts["stopped"] > 0), int(parts["infeasible"] > 0)) if ok else None


def _sampling(
    engine: Engine, tasks: Sequence[Task], opts: EvalOptions, turn_budget: int = 0
) -> tuple[dict[str, tuple[float, float, float]], dict[str, dict[str, float]]]:
    """Sampled metrics over the items, each (mean over items, 95% interval over items): pass@k and
    maj@k; and for a multi-turn domain (`turn_budget` > 1) the coding loop's figures at the
    sampling temperature: `pass1-by-turn@t` (the share of an item's samples passed within t turns)
    for t = 1..budget and `converted-at-turn@t` (the share passed at turn t exactly: a failed turn
    t-1 the revision converted; pass1-by-turn@t minus pass1-by-turn@(t-1)) and `repeated-at-turn@t` (the
    share whose turn-t action is turn t-1's again, compared by the domain's `action_key`: for code,
    the same code whitespace aside; a revision that handed back the failed attempt) for t = 2..budget. Every
    interval is of the mean of per-item values, so an item's samples count as one item, not as
    independent draws. Also returns those per-item values: item id -> metric -> value."""
    params = SamplingParams(max_tokens=16, temperature=opts.temperature, n=opts.samples, seed=opts.seed)
    items: dict[str, dict[str, float]] = {}  # item id -> metric -> value, in task order
    desc = f"eval {tasks[0].domain} x{opts.samples}" if tasks else "eval"
    runs = _groups(engine, tasks, params, max(1, opts.batch_size // opts.samples), opts, desc)
    for task, run in zip(tasks, runs, strict=True):
        mine = items.setdefault(task.id, {})
        episodes = run.episodes or [Episode("")] * len(run.final)  # a group masked before verification
        verdicts = _judged(run)
        judged = [(extract_answer(e.completion), v.ok) for e, v in zip(episodes, verdicts) if v.ok is not None]
        answers, correct = [a for a, _ in judged], [bool(v) for _, v in judged]
        for k in opts.ks:
            if k <= len(judged):
                mine[f"pass@{k}"] = pass_at_k(len(judged), sum(correct), k)
                mine[f"maj@{k}"] = maj_at_k(answers, correct, k, opts.seed)
        if turn_budget > 1:
            used = [p.turns for p, v in zip(run.played(), verdicts) if v.ok is not None]
            passed = [n for n, ok in zip(used, correct) if ok]  # turns each passing sample used
            key = get(task.domain).action_key  # what of an action counts when two are compared
            actions = [[key(t.action) for t in e.turns] for e, v in zip(episodes, verdicts) if v.ok is not None]
            for t in range(1, turn_budget + 1) if used else ():
                mine[f"pass1-by-turn@{t}"] = sum(n <= t for n in passed) / len(used)
                if t > 1:
                    mine[f"converted-at-turn@{t}"] = sum(n == t for n in passed) / len(used)
                    mine[f"repeated-at-turn@{t}"] = sum(len(a) >= t and a[t - 1] == a[t - 2] for a in actions) / len(
                        used
                    )
    items = {tid: values for tid, values in items.items() if values}  # an item with no judged sample has none
    per: dict[str, list[float]] = {}  # metric -> its per-item values, in task order
    for values in items.values():
        for metric, value in values.items():
            per.setdefault(metric, []).append(value)
    return {key: (sum(v) / len(v), *mean_interval(v)) for key, v in sorted(per.items())}, items


def evaluate_sets(
    engine: Engine, sets: Mapping[str, DomainSet], opts: EvalOptions = EvalOptions(), sample_kinds: Iterable[str] = ()
) -> dict[str, DomainResult]:
    """Greedy results of every set (keyed as given); sampled metrics for the sets whose kind
    is in `sample_kinds` when `opts.samples` > 0. Multi-turn domains are played as episodes."""
    tasks = {key: s.tasks() for key, s in sets.items()}
    flat = [t for ts in tasks.values() for t in ts]
    greedy = SamplingParams(max_tokens=16, temperature=0.0, n=1, seed=0)
    runs = iter(_groups(engine, flat, greedy, opts.batch_size, opts))
    kinds = set(sample_kinds)
    out = {}
    for key, s in sets.items():
        items, values, turns, stops, samples = [], [], [], [], []
        for task in tasks[key]:
            run = next(runs)
            ok, train_ok, value, error = _judged(run)[0]
            items.append((task.id, ok, train_ok))
            samples.append(_sample(task, run, value, ok, error))
            turns.append(run.played()[0].turns)
            stops.append(_stop(run.final[0]))
            if value is not None and ok is not None:
                values.append(value)
        episodes: dict[str, Any] = {}  # a multi-turn domain's turns, turn budget and stops
        if get(s.domain).environment() is not None:  # multi-turn
            episodes = {"turns": turns, "turn_budget": eval_budgets([s.domain], opts)[s.domain].turns, "stops": stops}
        sampling, per_item = None, None
        if opts.samples and s.kind in kinds and tasks[key]:
            sampling, per_item = _sampling(engine, tasks[key], opts, episodes.get("turn_budget", 0))
        label = eval_verifier_name(get(s.domain))
        out[key] = _result(
            s.domain,
            s.level,
            s.kind,
            s.requested,
            label,
            items,
            values,
            sampling,
            samples=samples,
            **episodes,
            sampling_items=per_item,
        )
    return out


def _sample(task: Task, run: GroupRun, value: float | None, ok: bool | None, error: ErrorRecord | None) -> ItemSample:
    """The item's last prompt message and its first sample's completion (an episode's whole text)."""
    rollouts = run.result.rollouts if run.result is not None else ()
    episodes = run.episodes or [Episode(r.completion.text) for r in rollouts]
    prompt = task.prompt[-1].content if task.prompt else ""
    reason = f"{error.kind}: {error.message}" if error is not None else ""
    images = tuple(i.sha256 for m in task.prompt for i in m.images)
    return ItemSample(task.id, prompt, episodes[0].completion if episodes else "", value, ok, reason, images)


def evaluate_heldout(
    engine: Engine,
    heldout: HeldoutSet,
    opts: EvalOptions = EvalOptions(),
    subset: int | None = None,
    rotation: Mapping[str, DomainSet] | None = None,
    probes: bool = True,
) -> EvalTable:
    """The core sets (their first `subset` items when given), the probes (when `probes`)
    and a rotation slice per domain (when given), in one batched generation."""
    core = {s.domain: (s.head(subset) if subset else s) for s in heldout.of_kind("core").values()}
    sets: dict[str, DomainSet] = {f"core:{k}": s for k, s in core.items()}
    if probes:
        sets.update({key: s for key, s in heldout.sets.items() if s.kind in ("above", "transfer")})
    sets.update({f"rotation:{k}": s for k, s in (rotation or {}).items()})
    res = evaluate_sets(engine, sets, opts, sample_kinds=("core",) if probes else ())
    return EvalTable(
        engine.version,
        {k.split(":", 1)[1]: r for k, r in res.items() if k.startswith("core:")},
        {k: r for k, r in res.items() if k.startswith(("above:", "transfer:"))},
        {k.split(":", 1)[1]: r for k, r in res.items() if k.startswith("rotation:")},
        heldout.version,
    )


def evaluate(
    engine: Engine, difficulties: Mapping[str, int], tasks_per_domain: int, max_tokens: int = 16, batch_size: int = 256
) -> EvalTable:
    """Greedy held-out accuracy per domain on up to `tasks_per_domain` distinct tasks each."""
    heldout = build_heldout(difficulties, tasks_per_domain)
    return evaluate_heldout(engine, heldout, EvalOptions(max_tokens=max_tokens, batch_size=batch_size))
