"""The `vllm` engine: the Engine contract over a vLLM OpenAI server that posttrain starts
and owns (`VLLMServer`) or attaches to, with weight sync the way RL systems drive vLLM.

Invariant: every Completion's token ids and log-probs are the server's, and
`logprobs[i]` is `log_softmax(logits / T)` of `token_ids[i]` (T = 1 for greedy rows),
as in the hf engine: the server runs with `--logprobs-mode processed_logprobs`, and a
request with top_p < 1 (whose processed log-probs vLLM renormalises over the nucleus)
is a ConfigError. Prompts go as token ids; text is decoded from the ids by posttrain's
tokenizer (vLLM loads the model directory's tokenizer only because it will not return
log-probs without one). Each request carries a seed (its own, else one drawn from the
engine's seeded generator); vLLM seeds sample j of a request with seed + j on a
per-request generator, so samples do not depend on batching. `model_version` is the
version the engine acknowledged: `update_weights` waits until no request is in
flight and holds new ones back, then pauses the server, loads (full weights by vLLM's
in-place layerwise `reload_weights` through `/collective_rpc`; a LoRA adapter
directory by `/v1/load_lora_adapter` with `load_inplace`), resets the prefix cache,
resumes, and only then bumps the version (a full checkpoint missing any of the served
model's tensors is refused before it is sent: vLLM would take it and break). A load
that fails leaves vLLM's model broken on a CPU (its parameters on the meta device),
so an owned server is restarted and
re-synced to the last acknowledged weights before the push is retried; after
`push_retries` the push raises WeightSyncError and the version stays. A request that
meets a dead or hung owned server (connection refused or reset, timeout, 5xx with
/health failing) restarts it (at most `max_restarts` times over the engine's life),
re-syncs the acknowledged weights, then retries; so a killed server costs time, never
a sample scored on other weights. Every call has a timeout. Counters (`stats()`)
count retries, restarts and failed loads.

A tied-embedding model (lm_head is the input embedding) is served from an exported
copy with `tie_word_embeddings: false` and an `lm_head.weight` equal to the embedding:
vLLM's CPU build repacks lm_head into its own buffer, so an in-place reload of a tied
model updates the embedding and leaves the output head on the old weights
(measured: |dlogprob| 0.57 after a reload). Every full checkpoint pushed gets the same
`lm_head` file. The exported copy computes exactly what the tied model computes.

`skip_prefix_reset` and `skip_push` exist for tests only (the verified-sync probe must
catch a skipped prefix-cache reset and a skipped load); never set them in a run.

From a script: `with VLLMServer(model_dir, run_dir) as server: engine =
VLLMEngine(tokenizer, server=server)`; `VLLMEngine.transports` names the push routes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from posttrain.configs.engine import SpeculationConfig, VLLMConfig
from posttrain.engine import http
from posttrain.engine.base import Engine, chat_ids, check_request
from posttrain.engine.openai import completion_body, decoded, parse_choices, post_json
from posttrain.engine.validate import screen
from posttrain.errors import ConfigError, GenerationError, ServerUnavailable, WeightSyncError
from posttrain.progress import each_reported
from posttrain.types import Completion, GenerationRequest, Message

VLLM_PYTHON_ENV = "POSTTRAIN_VLLM_PYTHON"
"""Environment variable naming the vLLM venv's interpreter (else <repo>/.venv-vllm/bin/python)."""
BASE_NAME = "base"
"""The served name of the model the server was started with."""
ADAPTER_NAME = "policy"
"""The served name of the LoRA adapter pushes load in place."""
LM_HEAD_FILE = "lm_head.safetensors"
"""The file an untied copy adds: `lm_head.weight`, equal to the embedding."""
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM allocates for (--max-lora-rank must be one of them)."""
_SEED_SPAN = 1 << 62
"""Seeds sent to vLLM are below this (it adds the sample index; they stay in int64)."""

Transport = Literal["reload", "lora"]


def default_python() -> Path:
    """The vLLM interpreter: $POSTTRAIN_VLLM_PYTHON, else <repo>/.venv-vllm/bin/python."""
    env = os.environ.get(VLLM_PYTHON_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def group_alive(pgid: int) -> bool:
    """Whether a process of process group `pgid` still runs (zombies, dead but not yet reaped by
    whoever inherited them, do not count): read from /proc, else by signal 0 to the group."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


_KV_CACHE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")
"""The line vLLM logs once its KV cache is allocated (`VLLMServer.kv_cache_tokens`)."""


def prometheus_sum(text: str, name: str) -> float:
    """The samples of metric `name` in Prometheus text exposition `text`, summed over their labels
    (samples of other names, `name_created` among them, are not counted); 0.0 when none."""
    sample = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(m.group(1)) for m in sample.finditer(text))


def prometheus_by_label(text: str, name: str, label: str) -> dict[str, float]:
    """The samples of metric `name` in `text` by the value of their `label` (summed over the
    other labels); samples without that label are left out."""
    sample = re.compile(rf"^{re.escape(name)}{{([^}}]*)}} (\S+)$", re.M)
    pair = re.compile(rf'(?:^|,){re.escape(label)}="([^"]*)"')
    out: dict[str, float] = {}
    for m in sample.finditer(text):
        found = pair.search(m.group(1))
        if found:
            out[found.group(1)] = out.get(found.group(1), 0.0) + float(m.group(2))
    return out


def speculative_config(spec: SpeculationConfig) -> dict[str, Any]:
    """vLLM's `--speculative-config` for `engine.speculation` kind suffix: its n-gram lookup
    (model-free: the last 2 to `max_match` tokens matched in the prompt and the sequence so far,
    `max_draft` tokens proposed), the closest drafter vLLM has to posttrain's suffix drafter (which
    also drafts from the group's siblings and earlier rollouts of the task)."""
    return {
        "method": "ngram",
        "num_speculative_tokens": spec.max_draft,
        "prompt_lookup_max": spec.max_match,
        "prompt_lookup_min": min(2, spec.max_match),
    }


SPEC_METRICS = {  # posttrain's speculation counters (engine/speculate.py) from vLLM's Prometheus counters
    "spec_rows": "vllm:spec_decode_num_drafts_total",  # drafts verified
    "spec_proposed": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SAMPLED_SPEC_LOGPROBS = (
    "vLLM 0.32 reports log-probs that are not the policy's for the tokens it drafts when sampling (measured: "
    "0.0 for an accepted draft token, the residual distribution's after a rejection; docs/engines.md)"
)
"""Why the vllm engine speculates for greedy requests only (the engine's refusal and `posttrain train`'s)."""


SOCKET_NAME = "api.sock"
"""The owned server's Unix domain socket, in a folder only this user can enter (`VLLMServer.socket`)."""


# -- tied embeddings ----------------------------------------------------------


def _read_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())


def untie(checkpoint: str | Path) -> bool:
    """Make a full checkpoint directory vLLM-reloadable in place: when its config ties the
    embeddings, add LM_HEAD_FILE (`lm_head.weight` = the embedding) and set
    `tie_word_embeddings: false`. Returns whether it changed anything."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    d = Path(checkpoint)
    cfg = _read_config(d)
    if not cfg.get("tie_word_embeddings", False) or (d / LM_HEAD_FILE).exists():
        return False
    name = "model.embed_tokens.weight"
    index = d / "model.safetensors.index.json"
    files = (
        [d / json.loads(index.read_text())["weight_map"][name]] if index.exists() else sorted(d.glob("*.safetensors"))
    )
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            if name in st.keys():  # noqa: SIM118 - safe_open has keys(), not __contains__
                save_file({"lm_head.weight": st.get_tensor(name).clone()}, str(d / LM_HEAD_FILE))
                break
    else:
        raise ConfigError(f"{d}: config ties the embeddings but no safetensors file holds {name}")
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"]["lm_head.weight"] = LM_HEAD_FILE
        index.write_text(json.dumps(data, indent=2))
    cfg["tie_word_embeddings"] = False
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return True


def export_for_vllm(model_dir: str | Path, out: str | Path) -> Path:
    """A copy of `model_dir` that vLLM serves and reloads exactly: the weight files hard-linked
    (copied across file systems) and the rest copied, so the copy outlives its source and writing
    it never writes the source, and for a tied-embedding model a config
    with `tie_word_embeddings: false` and LM_HEAD_FILE (see `untie`). An untied model is linked
    as it is."""
    src, dst = Path(model_dir).resolve(), Path(out)
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            if not f.name.endswith((".safetensors", ".bin")):
                shutil.copyfile(f, dst / f.name)  # small; `untie` rewrites config and index: never the original
            else:
                try:
                    os.link(f, dst / f.name)  # weights are only read
                except OSError:  # another file system, or links refused
                    shutil.copyfile(f, dst / f.name)
    untie(dst)
    return dst


# -- the server process -------------------------------------------------------


class VLLMServer:
    """A vLLM OpenAI server process that this object starts, owns and stops: the vLLM venv's
    interpreter, serving on a Unix domain socket (`socket`) in a folder of mode 0700 (no TCP port:
    its development routes, /pause, /collective_rpc, /reset_prefix_cache, /resume, which vLLM's
    --api-key does not guard, take orders only from this user's processes), HF_HUB_OFFLINE=1,
    its own process group, its log in `<run_dir>/vllm/server.log`, its pid (= its process group)
    in `server.pid`. Serves an export of `model_dir` (see `export_for_vllm`) as BASE_NAME; `lora_rank` enables runtime
    adapters up to that rank. Stopped on `stop()`, at the end of a `with` block, and at exit."""

    def __init__(
        self,
        model_dir: str | Path,
        run_dir: str | Path,
        config: VLLMConfig | None = None,
        lora_rank: int | None = None,
        speculation: SpeculationConfig | None = None,
    ) -> None:
        self.cfg = config or VLLMConfig()
        self.speculation = speculation if speculation is not None and speculation.kind != "off" else None
        if self.speculation is not None and self.speculation.kind != "suffix":
            raise ConfigError(f"vllm engine: speculation kind {self.speculation.kind!r} is not one vLLM can draft with")
        self.dir = Path(run_dir) / "vllm"
        self.model_dir = Path(model_dir)
        self.lora_rank = lora_rank
        self.python = Path(self.cfg.python) if self.cfg.python else default_python()
        if not self.python.exists():
            raise ConfigError(
                f"engine.vllm.python: {self.python} does not exist; make the vLLM venv (`make vllm-venv`) "
                f"or set {VLLM_PYTHON_ENV}"
            )
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.starts = 0
        self._socket_dir: Path | None = None

    @property
    def socket(self) -> Path:
        """The Unix domain socket the server listens on (the same path across restarts), in a
        fresh folder of mode 0700 under the system's temporary folder (a socket path must stay
        under 108 bytes, which a run folder's may not)."""
        if self._socket_dir is None:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="posttrain-vllm-"))  # mode 0700, ours
        return self._socket_dir / SOCKET_NAME

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    def command(self) -> list[str]:
        cfg, cpu = self.cfg, not _cuda()
        dtype = cfg.dtype if cfg.dtype != "auto" or not cpu else "float32"
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.dir / "model")]
        cmd += ["--served-model-name", BASE_NAME, "--uds", str(self.socket), "--dtype", dtype]
        cmd += ["--gpu-memory-utilization", str(cfg.memory_fraction), "--logprobs-mode", "processed_logprobs"]
        cmd += ["--enforce-eager"] if cpu else []
        cmd += ["--max-model-len", str(cfg.max_model_len)] if cfg.max_model_len else []
        if cpu and not any("chunked-prefill" in a for a in cfg.extra_args):
            # vLLM 0.32's CPU build kills its engine core ("CPU Generator does not use offset") when a
            # seeded request's prefill is split over two scheduler steps: no chunked prefill, and a
            # step budget that holds a whole prompt of the model's length
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(self._step_tokens())]
        if self.lora_rank is not None:
            rank = next((r for r in _LORA_RANKS if r >= self.lora_rank), None)
            if rank is None:
                raise ConfigError(f"trainer.lora.rank {self.lora_rank} is above vLLM's largest ({_LORA_RANKS[-1]})")
            cmd += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "1"]
        if self.speculation is not None:
            cmd += ["--speculative-config", json.dumps(speculative_config(self.speculation))]
        return cmd + list(cfg.extra_args)

    def _step_tokens(self) -> int:
        """Tokens per scheduler step without chunked prefill: at least the longest sequence the
        server takes (engine.vllm.max_model_len, else the model's max_position_embeddings, times
        its RoPE scaling's factor as vLLM reads it: `position_limit`)."""
        from types import SimpleNamespace

        from posttrain.model.arch import position_limit

        longest = self.cfg.max_model_len
        if longest is None:
            config = json.loads((Path(self.model_dir) / "config.json").read_text())
            longest = position_limit(SimpleNamespace(**config)) or 0
        return max(int(longest), 2048)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc, /reset_prefix_cache
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter
            "VLLM_CPU_KVCACHE_SPACE": str(self.cfg.cpu_kv_cache_gib),
        }

    def start(self) -> str:
        """Start the process (the model exported on the first start) and wait until /health
        answers; returns its base URL (http://127.0.0.1:<port>). ServerUnavailable when it exits
        or stays unhealthy for `startup_timeout_s`, with the log's tail."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / "model").exists():
            export_for_vllm(self.model_dir, self.dir / "model")
        self.socket.unlink(missing_ok=True)  # left by a killed server: vLLM's bind would fail on it
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts + 1}: {self.socket} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1
        (self.dir / "server.pid").write_text(f"{self.proc.pid}\n")  # = its process group
        atexit.register(self.stop)  # its own session outlives this process otherwise (not after SIGKILL)
        url = "http://vllm"  # the host name is only a label: the client connects to `socket`
        try:
            self._wait_healthy(url)
        except BaseException:
            self.stop()
            raise
        self.url = url
        return url

    def client(self, timeout_s: float, max_connections: int = 4) -> Any:
        """An HTTP client of this server (over `socket`; every call bounded by `timeout_s` in all)."""
        return http.client(timeout_s, max_connections, uds=str(self.socket))

    def _wait_healthy(self, url: str) -> None:
        import httpx

        deadline = time.monotonic() + self.cfg.startup_timeout_s
        with self.client(5.0) as health:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise ServerUnavailable(f"vllm server exited with {self.proc.returncode}: {self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if health.get(url + "/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise ServerUnavailable(
                        f"vllm server not healthy after {self.cfg.startup_timeout_s}s: {self.log_tail()}"
                    )
                time.sleep(0.5)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def kv_cache_tokens(self) -> int | None:
        """Tokens of KV cache the server's latest start allocated, as its log states them ("CPU KV
        cache size: 640 tokens"; on a GPU "GPU KV cache size"); None before the line is logged. The
        figure counts every block, vLLM's reserved null block among them (one block fewer holds
        sequences). `--num-gpu-blocks-override N` makes it N blocks (128 tokens each on the CPU build)."""
        last = self.log_tail(1 << 30).rsplit("=== start ", 1)[-1]
        found = _KV_CACHE_LINE.findall(last)
        return int(found[-1].replace(",", "")) if found else None

    def metric(self, name: str) -> float:
        """A metric of the server's Prometheus `/metrics`, its samples summed over their labels
        (e.g. `vllm:num_preemptions_total`, the requests vLLM preempted for want of KV blocks since
        it started); 0.0 when the server reports none of it."""
        with self.client(30.0) as c:
            return prometheus_sum(c.get(self.url + "/metrics").raise_for_status().text, name)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the server's whole process group (tests use it to kill or hang it)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """`halt` the server and remove its socket's folder."""
        self.halt()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def halt(self) -> None:
        """SIGTERM the process group, SIGKILL after 15 s; wait for it (its leader reaped, the rest of
        the group killed and, for up to 10 s, waited for until none runs). The socket's path stays."""
        if self.proc is None:
            return
        self.kill(signal.SIGTERM)
        self.kill(signal.SIGCONT)  # a stopped (hung) group handles SIGTERM only once continued
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.proc.wait()
        self.kill(signal.SIGKILL)  # children (engine core, workers) that outlived the leader
        deadline = time.monotonic() + 10.0
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILL is delivered at once, the exit takes a moment
        self.proc = None
        self.url = ""
        atexit.unregister(self.stop)

    def restart(self) -> str:
        """`halt`, then `start` on the same socket path (the engine's client keeps it)."""
        self.halt()
        return self.start()


# -- the engine -----------------------------------------------------------------


@dataclass(frozen=True)
class _Loaded:
    """What the server was last told to serve (None path: the model it started with)."""

    path: Path | None
    transport: Transport | None


class VLLMEngine(Engine):
    """The Engine protocol over a vLLM server: owned (`server`) or attached (`url`)."""

    transports: tuple[Transport, ...] = ("reload", "lora")
    """Push routes: `reload` (a full checkpoint directory, reloaded layer by layer in place)
    and `lora` (an adapter directory, loaded in place). `update_weights` picks by the folder:
    a LoRA policy pushes its adapter (tiny model, CPU: 8 ms load against 56 ms for a full
    reload, a tenth of the bytes). `last_push_s` times each call of the last push."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        server: VLLMServer | None = None,
        url: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 2,
        concurrency: int = 16,
        seed: int | None = None,
        push_timeout_s: float = 300.0,
        push_retries: int = 2,
        max_restarts: int = 5,
        skip_prefix_reset: bool = False,
        skip_push: bool = False,
        speculation: SpeculationConfig | None = None,
    ) -> None:
        if (server is None) == (url is None):
            raise ConfigError("vllm engine: give either a server to own or the url of one to attach to")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ConfigError(f"engine.url must be an http:// or https:// URL, got {url!r}")
        self.server, self.tokenizer = server, tokenizer
        self.url = server.url if server is not None else str(url).rstrip("/").removesuffix("/v1")
        if not self.url:
            raise ConfigError("vllm engine: the server is not started (use it as a context manager or call start())")
        self.retries, self.push_retries, self.max_restarts = retries, push_retries, max_restarts
        self.timeout_s, self.push_timeout_s = timeout_s, push_timeout_s
        self.skip_prefix_reset, self.skip_push = skip_prefix_reset, skip_push  # tests only
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.version = 0
        self.model = BASE_NAME
        self._loaded = _Loaded(None, None)
        self._rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
        self._client = (
            server.client(timeout_s, concurrency + 4) if server is not None else http.client(timeout_s, concurrency + 4)
        )
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="vllm-engine")
        self._gate = threading.Condition()  # in-flight calls against a push
        self._inflight, self._pushing = 0, False
        self._restart_lock = threading.Lock()
        self._epoch = 0  # bumped by every restart
        self._lock = threading.Lock()  # the seed generator and the counters
        self._counts = {"request_retries": 0, "restarts": 0, "pushes": 0, "push_failures": 0}
        self.speculation = speculation if speculation is not None and speculation.kind != "off" else None
        self._spec_last: dict[str, float] = {}  # the server's counters as last read (they restart with it)
        self._spec_base: dict[str, float] = {}  # what earlier server processes counted
        self.last_push_s: dict[str, float] = {}
        """Seconds of each call of the last acknowledged push (pause, load, reset_prefix_cache, resume)."""
        self._max_len, self._vocab = self._model_limits()

    @classmethod
    def start(cls, model_dir: str | Path, run_dir: str | Path, tokenizer: Any, config: VLLMConfig | None = None,
              lora_rank: int | None = None, speculation: SpeculationConfig | None = None,
              **kw: Any) -> VLLMEngine:  # fmt: skip
        """Start a server for `model_dir` (its files in `run_dir`/vllm) and an engine that owns it;
        with `speculation` (kind suffix) the server drafts with its n-gram lookup."""
        server = VLLMServer(model_dir, run_dir, config, lora_rank, speculation)
        server.start()
        try:
            return cls(tokenizer, server=server, speculation=speculation, **kw)
        except BaseException:
            server.stop()
            raise

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._client.close()
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        """Requests retried, server restarts, pushes acknowledged, push attempts that failed."""
        with self._lock:
            return dict(self._counts)

    def counters(self) -> dict[str, int]:
        """The Engine contract's counters for the metrics row: `stats()`, and with speculation the
        server's draft counters as posttrain names them (`spec_rows`, `spec_proposed`,
        `spec_accepted`, `spec_drafting`, `spec_accepted_d{i}` and `spec_proposed_d{i}`, the latter
        as vLLM counts depth: every draft; engine/speculate.py `acceptance_row`), summed over the
        server's restarts."""
        out = self.stats()
        if self.speculation is not None:
            out |= self._spec_counters()
        return out

    def _spec_counters(self) -> dict[str, int]:
        """The server's draft counters, summed over its restarts; while `/metrics` does not answer
        (a server restarting), the totals as last read: a metrics row never fails for them."""
        import httpx

        try:
            text = self._client.get(self.url + "/metrics", timeout=self.timeout_s).raise_for_status().text
        except httpx.HTTPError:
            with self._lock:
                return {k: int(self._spec_base.get(k, 0.0) + v) for k, v in self._spec_last.items()}
        now = {key: prometheus_sum(text, name) for key, name in SPEC_METRICS.items()}
        now["spec_drafting"] = now["spec_rows"]  # row-steps that drafted: one draft each
        for pos, value in prometheus_by_label(text, SPEC_PER_POS, "position").items():
            if pos.isdigit():
                now[f"spec_accepted_d{int(pos) + 1}"] = value
                now[f"spec_proposed_d{int(pos) + 1}"] = now["spec_rows"]
        with self._lock:
            for key, value in now.items():
                if value < self._spec_last.get(key, 0.0):  # a restarted server counts from 0
                    self._spec_base[key] = self._spec_base.get(key, 0.0) + self._spec_last[key]
                self._spec_last[key] = value
            return {key: int(self._spec_base.get(key, 0.0) + value) for key, value in now.items()}

    # -- Engine contract ------------------------------------------------------

    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return chat_ids(self.tokenizer, messages)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """For each request, `params.n` completions, all from the weights of one acknowledged version."""
        for i, req in enumerate(requests):
            self._validate(i, req)
        with self._lock:
            seeds = [
                req.params.seed if req.params.seed is not None else self._rng.randrange(_SEED_SPAN) for req in requests
            ]
        with self._admitted() as version:
            calls = self._pool.map(lambda rs: self._one(rs[0], rs[1], version), zip(requests, seeds))
            outs = each_reported(calls, [r.params.n for r in requests])  # a listener's progress bar
            return decoded(requests, screen(requests, outs, self._vocab, (version, self.version)), self.decode)

    def update_weights(self, source: Any) -> int:
        """Load a checkpoint directory the server can read (full weights, or a LoRA adapter
        directory: one holding adapter_config.json) and return the new acknowledged version.
        WeightSyncError when the server refused it `push_retries + 1` times."""
        if not isinstance(source, (str, Path)) or not Path(source).is_dir():
            raise ConfigError(f"vllm engine: update_weights takes a checkpoint directory, got {source!r}")
        path = Path(source).resolve()
        transport: Transport = "lora" if (path / "adapter_config.json").exists() else "reload"
        if transport == "reload":
            untie(path)
            self._check_complete(path)
        with self._exclusive():
            if not self.skip_push:  # tests only: acknowledge without loading
                self._push(path, transport)
            self._loaded = _Loaded(path, transport)
            self.model = ADAPTER_NAME if transport == "lora" else BASE_NAME
            self.version += 1
            self._count("pushes")
            return self.version

    def _check_complete(self, path: Path) -> None:
        """A full push must hold every tensor the served model has: vLLM's layerwise reload of a
        folder with only some of them returns success and leaves the rest of the model broken
        (measured: NaN log-probs after reloading one tensor). Checked against the export an owned
        server serves (safetensors headers only); an attached server's model is not known here."""
        if self.server is None:
            return
        missing = _tensor_names(self.server.dir / "model") - _tensor_names(path)
        if missing:
            raise WeightSyncError(
                f"vllm engine: {path} lacks {len(missing)} of the model's tensors (e.g. {sorted(missing)[:3]}); "
                "a full push carries every tensor"
            )

    # -- requests -------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[int]:
        """Hold the call back while a push runs; yield the version every completion will carry."""
        with self._gate:
            self._gate.wait_for(lambda: not self._pushing)
            self._inflight += 1
            version = self.version
        try:
            yield version
        finally:
            with self._gate:
                self._inflight -= 1
                self._gate.notify_all()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Wait until no call is in flight and keep new ones out (a push)."""
        with self._gate:
            self._gate.wait_for(lambda: not self._pushing)
            self._pushing = True
            self._gate.wait_for(lambda: self._inflight == 0)
        try:
            yield
        finally:
            with self._gate:
                self._pushing = False
                self._gate.notify_all()

    def _validate(self, i: int, req: GenerationRequest) -> None:
        check_request(i, req, self._vocab, self._max_len, "the server's max_model_len")
        p, where = req.params, f"requests[{i}]"
        if p.top_p != 1.0:
            raise ConfigError(
                f"{where}.params.top_p is {p.top_p}: with the vllm engine top_p must be 1 (vLLM reports "
                "log-probs renormalised over the nucleus, the trainer over the whole vocabulary)"
            )
        if self.speculation is not None and p.temperature > 0:
            raise ConfigError(
                f"{where}.params.temperature is {p.temperature}: with engine.speculation the vllm engine "
                f"generates greedily only. {SAMPLED_SPEC_LOGPROBS}, and the trainer's behaviour log-probs must be "
                "the policy's; set engine.speculation.kind off for sampled rollouts, or use the hf engine's speculation"
            )

    def _one(self, req: GenerationRequest, seed: int, version: int) -> list[Completion]:
        """One request's completions. vLLM takes n = 1 only when greedy: a greedy group is
        sampled once and copied (greedy samples of one prompt are equal)."""
        p = req.params
        greedy = p.temperature == 0 and p.n > 1
        ask = replace(req, params=replace(p, n=1)) if greedy else req
        body = completion_body(self.model, ask, seed=seed % _SEED_SPAN)
        body["max_tokens"] = min(p.max_tokens, self._max_len - len(req.prompt_ids))
        data = self._call("/v1/completions", body, self.timeout_s)
        out = parse_choices(ask, data, version, _no_token_strings)
        return out * p.n if greedy else out

    def _call(self, path: str, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """POST with `retries`; a dead or hung owned server is restarted (and re-synced) between tries."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            epoch, url = self._epoch, self.url
            try:
                return post_json(self._client, url + path, body, timeout=timeout)
            except ServerUnavailable as exc:
                last = exc
                if attempt < self.retries:
                    self._count("request_retries")
                    self._recover(epoch, 0.2 * 2**attempt)
        raise GenerationError(f"vllm engine: {path} failed after {self.retries + 1} attempts: {last}")

    def _recover(self, epoch: int, backoff_s: float) -> None:
        """After a failed call made under `epoch`: restart the owned server if it is dead or
        does not answer /health (once per failure, whichever thread sees it first), else wait."""
        if self.server is None:
            time.sleep(backoff_s)
            return
        with self._restart_lock:
            if epoch != self._epoch:  # another call restarted it already
                return
            if self.server.alive() and self._healthy():
                time.sleep(backoff_s)
                return
            self._restart()

    def _healthy(self) -> bool:
        import httpx

        try:
            return self._client.get(self.url + "/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def _restart(self) -> None:
        """Restart the owned server and load the acknowledged weights into it; the new URL is
        published only then, so no request reaches it before the re-sync."""
        assert self.server is not None
        if self._counts["restarts"] >= self.max_restarts:
            raise GenerationError(
                f"vllm engine: the server died or hung and engine.vllm.max_restarts ({self.max_restarts}) "
                f"restarts are spent; log {self.server.log_path}: {self.server.log_tail(500)}"
            )
        self._count("restarts")
        url = self.server.restart()
        loaded = self._loaded
        if loaded.path is not None and loaded.transport is not None and not self.skip_push:
            self._load(url, loaded.path, loaded.transport)
        self._epoch += 1
        self.url = url

    # -- weight push ----------------------------------------------------------

    def _push(self, path: Path, transport: Transport) -> None:
        last: Exception | None = None
        for attempt in range(self.push_retries + 1):
            try:
                self._sync_calls(self.url, path, transport)
                return
            except GenerationError as exc:  # refused (4xx), failed (5xx), timed out, gone
                last = exc
                self._count("push_failures")
                if self.server is None:
                    time.sleep(0.5 * 2**attempt)
                    continue
                try:
                    with self._restart_lock:  # the failed load left the model broken: start clean
                        self._restart()
                except GenerationError as again:
                    raise WeightSyncError(
                        f"vllm engine: pushing {path} failed ({exc}) and so did the restart: {again}"
                    ) from again
        raise WeightSyncError(
            f"vllm engine: pushing {path} ({transport}) failed {self.push_retries + 1} times; the engine stays "
            f"at version {self.version} (the last acknowledged weights): {last}"
        )

    def _sync_calls(self, url: str, path: Path, transport: Transport) -> None:
        """Pause, load, reset the prefix cache, resume: every call with `push_timeout_s`; the
        seconds of each in `last_push_s`."""
        t, times = self.push_timeout_s, dict[str, float]()
        t0 = time.perf_counter()
        clear = "false" if self.skip_prefix_reset else "true"  # /pause clears the caches too by default
        post_json(self._client, url + "/pause", {}, timeout=t, params={"mode": "wait", "clear_cache": clear})
        times["pause"] = time.perf_counter() - t0
        times.update(self._load(url, path, transport))
        t0 = time.perf_counter()
        post_json(self._client, url + "/resume", {}, timeout=t)
        times["resume"] = time.perf_counter() - t0
        self.last_push_s = times

    def _load(self, url: str, path: Path, transport: Transport) -> dict[str, float]:
        """Load `path` by `transport` and reset the prefix cache; the seconds of each."""
        t, t0 = self.push_timeout_s, time.perf_counter()
        if transport == "lora":
            body: dict[str, Any] = {"lora_name": ADAPTER_NAME, "lora_path": str(path), "load_inplace": True}
            post_json(self._client, url + "/v1/load_lora_adapter", body, timeout=t)
        else:
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}, "timeout": t}
            post_json(self._client, url + "/collective_rpc", body, timeout=t)
        times = {"load": time.perf_counter() - t0}
        t0 = time.perf_counter()
        if not self.skip_prefix_reset:  # tests only: leave entries computed under the old weights
            post_json(self._client, url + "/reset_prefix_cache", {}, timeout=t)
        times["reset_prefix_cache"] = time.perf_counter() - t0
        return times

    def _model_limits(self) -> tuple[int, int]:
        """(max_model_len, vocabulary size) as the server reports them."""
        import httpx

        try:
            models = self._client.get(self.url + "/v1/models", timeout=self.timeout_s).json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ServerUnavailable(f"vllm engine: {self.url}/v1/models did not answer: {exc}") from exc
        entry = next((m for m in models if m.get("id") == BASE_NAME), models[0] if models else {})
        max_len = int(entry.get("max_model_len") or 0)
        if max_len < 2:
            raise ConfigError(f"vllm engine: {self.url} reports no max_model_len for {BASE_NAME!r}")
        return max_len, int(len(self.tokenizer))


def _tensor_names(model_dir: Path) -> set[str]:
    """The tensor names of a directory's safetensors files (headers only)."""
    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                names.update(st.keys())
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a torn file
            raise WeightSyncError(f"vllm engine: {f} is not a readable safetensors file: {exc}") from exc
    return names


def _no_token_strings(token: str) -> int:
    raise GenerationError(f"vllm engine: the server returned token {token!r} without token ids (return_token_ids)")
