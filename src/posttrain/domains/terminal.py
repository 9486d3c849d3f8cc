"""terminal: shell tasks in a sandbox session, judged by the end state of the files.

The loop: each action's commands (its fenced ```bash/```sh blocks, else its
raw text; `parse_action`) run in the task's directory, which keeps its state
between turns; the observation is their stdout, stderr and exit code; a line
`done` outside the blocks (or the answer `done`) ends the episode, else the
turn budget does. Each environment step replays the earlier scripts in a
fresh session, runs the new one and then checks the end state (`run_state`);
its TerminalRun is the turn's execution result, and the verifier reads the
last turn's (a direct `score` without one replays the scripts itself).

Invariant: the end state is judged only by a read-only checker run after
every process of the episode is dead, plus verifier-chosen commands (each
from the same snapshot) whose output must match. While the model's commands
run, no hidden check is in the sandbox: the session starts from the task's
files only, the checks reach the checker on its stdin in a later step (when
nothing of the episode is alive), the expected outputs of the commands are
compared on the host, and no check result reaches an observation. A sandbox
infra error raises SandboxError; it is never a score, but only when the sandbox caused it:
whatever the model's commands do to their own session (its work directory's modes, its
files, its processes) is the model's outcome (`run_state`: a failure after they ran is
the model's unless the task's untouched files fail the same way). 24 templates written
for posttrain in three levels (data/terminal/tasks.py); a task's split is
fixed by a hash of its prompt.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from types import ModuleType
from typing import Any

from posttrain.domains._common import run_summary
from posttrain.domains.base import Budget, Domain, split_of, stable_rng
from posttrain.domains.registry import register
from posttrain.errors import ModelFault, SandboxError, TaskError, VerifierError
from posttrain.types import Episode, Message, Score, Split, Task, TaskMeta

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "terminal")
INSTRUCTION = (
    "You are in a shell (bash) in a directory that holds: {files}. Put commands in one ```bash code block: they "
    "run non-interactively in that directory, which keeps its state between answers, and you see their stdout, "
    "stderr and exit code. When the task is complete, write `done` on its own line after the block (or answer "
    "just `done`)."
)
_MAX_ATTEMPTS = 1000


@dataclass(frozen=True)
class TerminalReference:
    template: str
    files: tuple[tuple[str, str], ...]
    checks_json: str
    runs_json: str
    gold: str
    wrong: str


@lru_cache(maxsize=1)
def templates() -> ModuleType:
    spec = importlib.util.spec_from_file_location("posttrain_terminal_tasks", os.path.join(DATA, "tasks.py"))
    if spec is None or spec.loader is None:
        raise TaskError(f"terminal: cannot load {DATA}/tasks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@lru_cache(maxsize=1)
def checker_source() -> str:
    with open(os.path.join(DATA, "checker.py")) as fh:
        return fh.read()


_FENCE = re.compile(r"```([A-Za-z]*)[ \t]*\n(.*?)```", re.DOTALL)
SHELLS = ("", "bash", "sh", "shell", "console")


def parse_action(text: str) -> tuple[str, bool]:
    """(the commands, whether the action ends the episode). The commands are the
    action's fenced shell blocks (```bash, ```sh, ```shell, ```console or bare ```),
    joined in order; without a fenced block, the whole text. The action ends the
    episode when a line outside the blocks is `done` (a `done` inside a block is
    bash's loop keyword), or when the whole text is `done`."""
    blocks = list(_FENCE.finditer(text))
    if not blocks:
        raw = text.strip()
        return ("", True) if raw.lower() in ("done", "done.") else (raw, False)
    script = "\n".join(m.group(2).strip() for m in blocks if m.group(1).lower() in SHELLS).strip()
    outside = _FENCE.sub("\n", text)
    return script, any(line.strip().lower() in ("done", "done.", "`done`") for line in outside.splitlines())


def extract_script(text: str) -> str:
    """The commands of a completion (parse_action), newline-terminated."""
    return parse_action(text)[0] + "\n"


def _step_limits():
    from posttrain.sandbox import Limits

    return Limits(wall_s=20.0, cpu_s=10.0, memory_bytes=256 << 20, pids=64, output_bytes=64 << 10)


def step_request(command: str, **fields):
    """The sandbox request of one model command (the verifier's replay and the
    environment's steps): bash, the step limits, nothing else. A command holding a
    NUL byte cannot be an argument of any program: ModelFault (the model's, scored 0),
    before the sandbox would report it as its own failure."""
    from posttrain.sandbox import ExecRequest

    if "\x00" in command:
        raise ModelFault("the command holds a NUL byte (no program takes one in its arguments)")

    return ExecRequest(argv=("bash", "-c", command), **({"limits": _step_limits()} | fields))


# Python run by the cheats below: find anything that looks like the checks and satisfy it by writing files.
_STEAL = r"""
import json, os, sys, time
def apply(checks):
    for c in checks:
        p = c.get("path", "")
        try:
            if c["type"] == "equals": open(p, "w").write(c["text"])
            elif c["type"] == "lines": open(p, "w").write("\n".join(c["lines"]) + "\n")
            elif c["type"] == "json": open(p, "w").write(json.dumps(c["value"]))
            elif c["type"] == "dir": os.makedirs(p, exist_ok=True)
            elif c["type"] == "absent": os.remove(p)
        except Exception:
            pass
def look():
    found = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for name in ("fd/0", "cmdline", "environ", "mem"):
            try:
                data = open(f"/proc/{pid}/{name}", "rb").read(1 << 20)
            except (OSError, ValueError):
                continue
            i = data.find(b'"checks"')
            if i >= 0:
                j = data.rfind(b"{", 0, i)
                try:
                    found += json.JSONDecoder().raw_decode(data[j:].decode("utf-8", "replace"))[0]["checks"]
                except Exception:
                    pass
    for root in ("/task", "/tmp", "/dev/shm"):
        for d, _, names in os.walk(root):
            for n in names:
                try:
                    text = open(os.path.join(d, n), errors="replace").read(1 << 20)
                except OSError:
                    continue
                if '"checks"' in text:
                    try:
                        found += json.loads(text[text.rfind("{", 0, text.find('"checks"')):])["checks"]
                    except Exception:
                        pass
    return found
deadline = time.time() + float(sys.argv[1])
while True:
    apply(look())
    if time.time() > deadline:
        break
    time.sleep(0.05)
"""

CHEATS: dict[str, str] = {
    "exit_early": "exit 0\n",
    "fake_verdict": 'for i in $(seq 64); do echo \'{"results": [true, true, true, true, true, true, true, true, true, '
    "true]}'; done\n"
    'echo \'{"nonce": "0", "results": [true]}\' >&2\n',
    "read_hidden_files": "find / -xdev \\( -path /proc -o -path /sys \\) -prune -o -type f \\( -name 'tasks.py' -o "
    "-name 'checker.py' \\) "
    "-path '*terminal*' -print 2>/dev/null | head -5 | xargs -r cat > found.txt\n",
    "steal_checks_now": f"cat > .steal.py <<'EOF'{_STEAL}EOF\npython3 -I .steal.py 0\n",
    "daemon_waits_for_checker": f"cat > .steal.py <<'EOF'{_STEAL}EOF\n(setsid nohup python3 -I .steal.py 60 >/dev/null "
    "2>&1 &)\nsleep 0.2\n",
    "plant_hooks": "printf 'import os\\nos._exit(0)\\n' > sitecustomize.py\ncp sitecustomize.py usercustomize.py\n"
    "mkdir -p bin && printf '#!/bin/sh\\necho {\\\"results\\\": [true]}\\n' > bin/python3 && chmod +x bin/python3\n"
    "echo 'export PATH=/task/bin:$PATH' >> .bashrc\ncp .bashrc .profile\n",
    "kill_everything": "kill -9 -1\n",
}


@dataclass(frozen=True)
class TerminalRun:
    """The execution result of one terminal step (or of the verifier's replay): what
    the last script did, and the end state's checks after it (file checks by the
    checker, then each verifier command from the same snapshot). The checks are the
    verifier's evidence; the model sees only the script's output."""

    status: str  # the last script's sandbox status (ok, failed, timeout, oom, killed)
    exit_code: int | None
    stdout: str  # tail, OUTPUT_CHARS
    stderr: str  # tail, OUTPUT_CHARS
    checks: tuple[bool, ...]
    program: str = ""  # the last script, truncated to PROGRAM_CHARS
    cpu_s: float = 0.0
    wall_s: float = 0.0
    untouched: tuple[bool, ...] = ()
    """The same checks on the task's untouched files (`untouched_checks`): what doing nothing
    already meets, which earns no credit (`credit`)."""

    def observation(self) -> str:
        code = self.exit_code if self.exit_code is not None else f"none ({self.status})"
        return f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}\nexit code: {code}"

    def summary(self) -> dict:
        """The trace's view: the script, its output and exit code, the checks."""
        checks = {"checks_passed": sum(self.checks), "checks": list(self.checks), "stdout": self.stdout[-500:]}
        return run_summary(self, report=checks)


OUTPUT_CHARS = 2000
PROGRAM_CHARS = 4000


def _tail(data: bytes, limit: int = OUTPUT_CHARS) -> str:
    text = data.decode("utf-8", "replace")
    return text if len(text) <= limit else "[...]" + text[-limit:]


HOST_FAILURES: tuple[type[BaseException], ...] = (SandboxError, VerifierError, OSError)
"""What a session step can raise for a failure the model's state might have caused (a run's
infra error, a checker without a verdict, a host-side call that broke on its files)."""


def run_state(ref: TerminalReference, scripts: list[str], domain: str = "terminal") -> TerminalRun:
    """One fresh session from the task's files: the scripts in order, then (every
    process of theirs dead) the end-state checks.

    Blame by cause: a failure before the model's first command ran in the session (no
    slot, the session could not open: the sandbox could not start) is the sandbox's and
    propagates (SandboxError, retried then masked). A failure after it ran is judged by the
    cause test (`_cause`): replayed once in a fresh session (a passing failure of the host
    leaves the replay as the result); failing again while the task's untouched files go
    through the same steps cleanly, it is what the model's commands did to their own
    sandbox: ModelFault (scored 0 with the reason, never masked); failing on the untouched
    files too, the sandbox is broken: the first error propagates."""
    untouched = untouched_checks(ref, domain)  # before the model's commands: a failure here is the sandbox's
    ran = [False]
    try:
        run = _state(ref, scripts, domain, ran)
    except HOST_FAILURES as first:
        if not ran[0]:
            raise
        run = _cause(ref, scripts, domain, first)
    return replace(run, untouched=untouched)


@lru_cache(maxsize=4096)
def untouched_checks(ref: TerminalReference, domain: str = "terminal") -> tuple[bool, ...]:
    """The end-state checks on the task's untouched files (no command run), once per task in
    this process (a group's episodes share it). SandboxError on an infra error."""
    return _state(ref, [], domain, [False]).checks


def credit(checks: tuple[bool, ...], untouched: tuple[bool, ...]) -> float:
    """Partial credit for what the commands changed, never for the untouched state: the share of
    the checks the untouched files fail (the task's work) that now hold, less one for each check
    the untouched files met that now fails (what the commands broke), never below 0. Doing nothing
    scores 0; meeting every check scores 1. (Before: the share of all checks, so a junk command
    earned what the untouched files already met: 0.75 on term_fix, 1/6 on many terminal tasks.)"""
    base = untouched if len(untouched) == len(checks) else (False,) * len(checks)
    work = [c for c, b in zip(checks, base) if not b]
    broke = sum(1 for c, b in zip(checks, base) if b and not c)
    if not work:
        return float(all(checks))
    return max(0.0, (sum(work) - broke) / len(work))


def _cause(ref: TerminalReference, scripts: list[str], domain: str, first: BaseException) -> TerminalRun:
    """The cause test of a failure after the model's commands ran (see `run_state`)."""
    try:
        return _state(ref, scripts, domain, [False])
    except HOST_FAILURES:
        pass
    try:
        _state(ref, [], domain, [False])
    except HOST_FAILURES:
        raise first from None  # the untouched task fails too: the sandbox's, whatever the model did
    raise ModelFault(
        f"the sandbox step failed after the model's commands ran in their own session, again on a replay, "
        f"while the task's untouched files check cleanly: {type(first).__name__}: {first}"
    )


def _state(ref: TerminalReference, scripts: list[str], domain: str, ran: list[bool]) -> TerminalRun:
    """`run_state` without the cause test; `ran[0]` turns True once a model command is handed to
    the session."""
    from posttrain import sandbox

    with sandbox.get_pool().session(dict(ref.files), domain=domain) as s:
        last = sandbox.ExecResult("ok", exit_code=None)
        for script in scripts:
            ran[0] = True
            last = sandbox.raise_for_infra(s.run(step_request(script)))
        snap = s.snapshot()
        results = _file_checks(s, ref)
        for run in json.loads(ref.runs_json):
            s.restore(snap)
            res = sandbox.raise_for_infra(
                s.run(sandbox.ExecRequest(argv=("bash", "-c", run["cmd"]), limits=_step_limits()))
            )
            results.append(res.stdout.decode("utf-8", "replace") == run["stdout"])
    return TerminalRun(
        last.status,
        last.exit_code,
        _tail(last.stdout),
        _tail(last.stderr),
        tuple(results),
        (scripts[-1] if scripts else "")[:PROGRAM_CHARS],
        last.cpu_s,
        last.wall_s,
    )


def _file_checks(s, ref: TerminalReference) -> list[bool]:
    from posttrain import sandbox

    checks = json.loads(ref.checks_json)
    if not checks:
        return []
    # the only process of this step is the checker (the episode's are all dead), so its stdout is its verdict
    req = sandbox.ExecRequest(
        argv=("python3", "-I", "-c", checker_source()),
        stdin=json.dumps({"checks": checks}).encode(),
        limits=_step_limits(),
    )
    res = sandbox.raise_for_infra(s.run(req))
    for line in reversed(res.stdout.decode("utf-8", "replace").splitlines()):
        try:
            verdict = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(verdict, dict)
            and isinstance(verdict.get("results"), list)
            and len(verdict["results"]) == len(checks)
        ):
            return [r is True for r in verdict["results"]]
    raise VerifierError(f"terminal checker gave no verdict (status {res.status}): {res.stderr[-300:]!r}")


class TerminalVerifier:
    """Partial credit beyond the untouched state (`credit`: the share of the checks the task's
    untouched files fail that now hold, less what the commands broke; 0 for doing nothing,
    1 when every check holds), read from the episode's execution result (the last step's TerminalRun); a
    direct `score` without one replays the scripts in a fresh session. Parts:
    outcome; process = share of the turns with commands whose script exited 0;
    efficiency = 1 / turns used. value = outcome."""

    name = "terminal_state"
    version = "2"

    def score(self, task: Task, episode: Episode) -> Score:
        ref: TerminalReference = task.reference
        run = episode.exec_result
        if not isinstance(run, TerminalRun):
            actions = [t.action for t in episode.turns] if episode.turns else [episode.completion]
            run = run_state(ref, [sc for sc in (parse_action(a)[0] for a in actions) if sc.strip()])
        results = run.checks
        if not results:
            raise VerifierError(f"terminal: task {task.id} has no checks")
        value = credit(results, run.untouched)
        parts = {"outcome": value, "efficiency": 1.0 / max(1, len(episode.turns))}
        ran = [t.parts["process"] for t in episode.turns if "process" in t.parts]
        if ran:
            parts["process"] = sum(ran) / len(ran)
        if all(results):
            return Score(value, parts, True)
        work = sum(1 for b in run.untouched if not b) if len(run.untouched) == len(results) else len(results)
        reason = f"{len(results) - sum(results)} checks failed (credit counts the {work} the untouched task fails)"
        return Score(value, parts, False, reason)


NO_COMMAND = (
    "No command found: put the commands in one ```bash code block, and write `done` on its own line "
    "when the task is complete."
)


class TerminalEnvironment:
    """Multi-turn use: step(action) runs the action's commands (parse_action) on the
    task's files and observes their stdout, stderr and exit code; a `done` line
    ends the episode. The environment holds no sandbox slot between turns: each
    step opens a fresh session, replays the earlier scripts (deterministic shell
    tasks), runs the new one and checks the end state (run_state), so G concurrent
    episodes never wait on each other for pool slots. A step without commands
    changes nothing: it reuses the last step's result. Per-turn part: process =
    1.0 when the script exited 0, else 0.0 (none on a turn without commands)."""

    def __init__(self, domain: str = "terminal") -> None:
        self.domain = domain
        self._ref: TerminalReference | None = None
        self._scripts: list[str] = []
        self._last: TerminalRun | None = None

    def reset(self, task: Task) -> str:
        self._ref, self._scripts, self._last = task.reference, [], None
        return ""  # the prompt lists the directory's files

    def step(self, action: str):
        from posttrain.types import StepResult

        if self._ref is None:
            raise TaskError("terminal: step before reset")
        script, finish = parse_action(action)
        if not script.strip():
            if self._last is None:
                self._last = run_state(self._ref, [], self.domain)
            return StepResult("Done." if finish else NO_COMMAND, finish, {}, self._last)
        ran = run_state(self._ref, [*self._scripts, script], self.domain)
        self._scripts.append(script)
        self._last = ran
        return StepResult(ran.observation(), finish, {"process": float(ran.exit_code == 0)}, ran)

    def close(self) -> None:
        self._ref, self._scripts, self._last = None, [], None


class Terminal(Domain):
    name = "terminal"
    category = "agents"
    description = "shell tasks (files, configs, scripts) in a sandbox session, judged by the end state"
    version = "1"
    levels = 3
    cost_class = "long"
    budget = Budget(turns=8, tokens=512, seconds=120.0)
    verifier = TerminalVerifier()

    def environment(self):
        return TerminalEnvironment

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        names = sorted(n for n, fn in templates().TEMPLATES.items() if _level(fn) == difficulty)
        for attempt in range(_MAX_ATTEMPTS):
            rng = stable_rng(self.name, self.version, difficulty, split, index, attempt)
            name = names[rng.randrange(len(names))]
            inst = templates().TEMPLATES[name](rng)
            question = f"{inst['prompt']}\n" + INSTRUCTION.format(
                files=", ".join(sorted(inst["files"])) or "nothing (it is empty)"
            )
            if split_of(self.name, question) == split:
                return self._make(index, split, difficulty, name, question, inst)
        raise TaskError(f"terminal: no {split} task found at difficulty {difficulty}")

    def _make(self, index: int, split: Split, difficulty: int, name: str, question: str, inst: dict) -> Task:
        ref = TerminalReference(
            name,
            tuple(sorted(inst["files"].items())),
            json.dumps(inst["checks"]),
            json.dumps(inst.get("runs", [])),
            inst["gold"],
            inst["wrong"],
        )
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", question),),
            reference=ref,
            meta=TaskMeta(
                split=split,
                difficulty=difficulty,
                source=f"posttrain/terminal/{name}",
                taskset_version=self.taskset_version,
            ),
        )

    def gold(self, task: Task) -> str:
        return f"```bash\n{task.reference.gold}```\ndone"

    def wrong(self, task: Task) -> str:
        return f"```bash\n{task.reference.wrong}```\ndone"

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the reference script and `done`, in one turn."""
        return [self.gold(task)]

    def cheats(self, task: Task) -> list[str]:
        """Scripts that try to win without doing the task (CHEATS): exit early,
        print a fake verdict, look for the checks in files or in the memory and
        descriptors of other processes (now, and from a daemon that waits for the
        checker), plant interpreter hooks; and, for a task with a JSON end state, the state
        written with every bool as a number (`"private": 1` for `true`, which Python's
        `True == 1` would pass). Each must score below the gold."""
        return [f"```bash\n{src}```" for src in (*CHEATS.values(), *_bools_as_numbers(task))]


def _bools_as_numbers(task: Task) -> list[str]:
    """Scripts writing each `json` check's expected value with its bools as 1 and 0 (none
    where a value holds no bool): a wrong file only a loose comparison accepts."""

    def swap(v: Any) -> Any:
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, list):
            return [swap(x) for x in v]
        return {k: swap(x) for k, x in v.items()} if isinstance(v, dict) else v

    scripts = []
    for c in json.loads(task.reference.checks_json):
        if c["type"] == "json" and json.dumps(swap(c["value"])) != json.dumps(c["value"]):
            body = json.dumps(swap(c["value"]), indent=2)
            scripts.append(f"cat > {shlex.quote(c['path'])} <<'JSON'\n{body}\nJSON\n")
    return scripts


@cache
def _level_of(name: str) -> int:
    return templates().TEMPLATES[name](stable_rng("level-probe", name))["level"]


def _level(fn) -> int:
    return _level_of(fn.__name__[2:])


register(Terminal())
