"""terminal: shell tasks in a sandbox session, judged by the end state of the files.

Invariant: the verifier replays the episode (the completion's script, or
every turn's command) in a fresh session started from the task's files,
then judges only the end state: a read-only checker run after every process
of the episode is dead, plus verifier-chosen commands (each from the same
snapshot) whose output must match. While the model's commands run, no
hidden check is in the sandbox: the session starts from the task's files
only, the checks reach the checker on its stdin in a later step (when
nothing of the episode is alive), and the expected outputs of the commands
are compared on the host. A sandbox infra error raises
SandboxError; it is never a score. 24 templates written for posttrain in
three levels (data/terminal/tasks.py); a task's split is fixed by a hash of
its prompt.
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from functools import cache, lru_cache
from types import ModuleType

from posttrain.domains.base import Budget, Domain, last_fenced_block, split_of, stable_rng
from posttrain.domains.registry import register
from posttrain.errors import TaskError, VerifierError
from posttrain.types import Episode, Message, Score, Split, Task, TaskMeta

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "terminal")
INSTRUCTION = ("You are in a shell (bash) in a directory that holds: {files}. Answer with a bash script in one "
               "```bash code block; it runs non-interactively in that directory.")
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


def extract_script(text: str) -> str:
    """The last fenced shell block of the completion, else the whole text."""
    return last_fenced_block(text, ("bash", "sh", "shell", "console"))


def _step_limits():
    from posttrain.sandbox import Limits

    return Limits(wall_s=20.0, cpu_s=10.0, memory_bytes=256 << 20, pids=64, output_bytes=64 << 10)


def step_request(command: str, **fields):
    """The sandbox request of one model command (the verifier's replay and the
    environment's steps): bash, the step limits, nothing else."""
    from posttrain.sandbox import ExecRequest

    return ExecRequest(argv=("bash", "-c", command), **({"limits": _step_limits()} | fields))


# Python run by the cheats below: find anything that looks like the checks and satisfy it by writing files.
_STEAL = r'''
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
'''

CHEATS: dict[str, str] = {
    "exit_early": "exit 0\n",
    "fake_verdict": "for i in $(seq 64); do echo '{\"results\": [true, true, true, true, true, true, true, true, true, "
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


class TerminalVerifier:
    """Fraction of end-state checks (files and command outputs) that hold."""

    name = "terminal_state"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        from posttrain import sandbox

        ref: TerminalReference = task.reference
        actions = [t.action for t in episode.turns] if episode.turns else [extract_script(episode.completion)]
        with sandbox.get_pool().session(dict(ref.files), domain="terminal") as s:
            for action in actions:
                sandbox.raise_for_infra(s.run(step_request(action)))
            snap = s.snapshot()
            results = self._file_checks(s, ref)
            for run in json.loads(ref.runs_json):
                s.restore(snap)
                res = sandbox.raise_for_infra(
                    s.run(sandbox.ExecRequest(argv=("bash", "-c", run["cmd"]), limits=_step_limits()))
                )
                results.append(res.stdout.decode("utf-8", "replace") == run["stdout"])
        if not results:
            raise VerifierError(f"terminal: task {task.id} has no checks")
        value = sum(results) / len(results)
        return Score(
            value,
            {"outcome": value},
            all(results),
            "" if all(results) else f"{len(results) - sum(results)} checks failed",
        )

    def _file_checks(self, s, ref: TerminalReference) -> list[bool]:
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


class TerminalEnvironment:
    """Multi-turn use: step(command) runs one bash command on the task's files
    and returns its output. The environment holds no sandbox slot between
    turns: each step opens a fresh session, replays the earlier commands
    (deterministic shell tasks) and runs the new one, so G concurrent episodes
    never wait on each other for pool slots."""

    def __init__(self, max_turns: int = 8) -> None:
        self.max_turns = max_turns
        self._files: dict[str, str | bytes] | None = None
        self._done: list[str] = []
        self.turns = 0

    def reset(self, task: Task) -> str:
        ref: TerminalReference = task.reference
        self._files, self._done, self.turns = dict(ref.files), [], 0
        return task.prompt[-1].content

    def step(self, action: str) -> tuple[str, bool]:
        from posttrain import sandbox

        if self._files is None:
            raise VerifierError("TerminalEnvironment.step before reset")
        self.turns += 1
        with sandbox.get_pool().session(self._files, domain="terminal") as s:
            for earlier in self._done:
                sandbox.raise_for_infra(s.run(step_request(earlier)))
            res = sandbox.raise_for_infra(s.run(step_request(action)))
        self._done.append(action)
        obs = (res.stdout + res.stderr).decode("utf-8", "replace")[
            -4000:
        ] + f"\n[exit {res.exit_code if res.exit_code is not None else res.status}]"
        done = self.turns >= self.max_turns or not action.strip()
        return obs, done

    def close(self) -> None:
        self._files, self._done = None, []


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
        return f"```bash\n{task.reference.gold}```"

    def wrong(self, task: Task) -> str:
        return f"```bash\n{task.reference.wrong}```"

    def cheats(self, task: Task) -> list[str]:
        """Scripts that try to win without doing the task (CHEATS): exit early,
        print a fake verdict, look for the checks in files or in the memory and
        descriptors of other processes (now, and from a daemon that waits for the
        checker), plant interpreter hooks. Each must score below the gold."""
        return [f"```bash\n{src}```" for src in CHEATS.values()]


@cache
def _level_of(name: str) -> int:
    return templates().TEMPLATES[name](stable_rng("level-probe", name))["level"]


def _level(fn) -> int:
    return _level_of(fn.__name__[2:])


register(Terminal())
