"""The control plane of the vLLM server posttrain starts takes orders only from posttrain (the `vllm`
lane: `make test-vllm`).

The owned server listens on a Unix domain socket in a folder of mode 0700 and on no TCP port, so
another local user's process cannot reach /pause, /collective_rpc, /reset_prefix_cache or
/resume (vLLM's --api-key would not guard them: it covers /v1, /v2, /inference, /cohere only);
and a change of served weights posttrain did not make (here made through the socket, as by a
process of posttrain's own user) is caught before the next push and stops the run, both figures named.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_sync_probe_vllm import _train_one_step

from posttrain.configs.engine import EngineConfig
from posttrain.configs.trainer import TrainerConfig
from posttrain.engine.vllm import default_python
from posttrain.errors import SyncVerificationError
from posttrain.model.arch import load_model
from posttrain.trainer.trainer import Trainer

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not default_python().exists(), reason="no .venv-vllm (make vllm-venv)"),
]


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except ProcessLookupError:
                continue
    return pids


def _tcp_listening_inodes() -> set[str]:
    """Inodes of every TCP socket on the host in state LISTEN (0A), IPv4 and IPv6."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":
                    inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            link = os.readlink(fd)
            if link.startswith("socket:["):
                out.add(link[len("socket:[") : -1])
    except (FileNotFoundError, PermissionError):
        pass
    return out


def _other_user_connects(path: Path) -> str:
    """In a child running as user `nobody` (uid 65534): try to connect to `path`; what happened."""
    import socket

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other local user
        os.close(read)
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            answer = b"connected"
        except PermissionError:
            answer = b"refused"
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            answer = type(exc).__name__.encode()
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        return f.read().decode()


def test_the_owned_server_takes_orders_only_from_posttrain(tiny_base, tmp_path):
    from posttrain.engine.sync import WeightSync, make_engine

    model, tok = load_model(tiny_base, device="cpu")
    trainer = Trainer(model, TrainerConfig(lr=1e-2))
    cfg = EngineConfig.model_validate({"kind": "vllm"})
    engine = make_engine(cfg, model, tok, 0, tmp_path)
    try:
        server = engine.server
        folder = server.socket.parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
        assert stat.S_ISSOCK(server.socket.stat().st_mode)
        # the API server (the group's leader) serves every HTTP route, the dev routes included: on no
        # TCP port (its worker's torch.distributed sockets on 127.0.0.1 are vLLM's internals, not HTTP)
        assert server.proc.pid in _group_pids(server.proc.pid)
        assert not _socket_inodes(server.proc.pid) & _tcp_listening_inodes(), "the API server listens on TCP"
        if os.getuid() == 0:  # another local user cannot even reach the socket
            assert _other_user_connects(server.socket) == "refused"

        sync = WeightSync(cfg, engine, trainer, tmp_path)
        _train_one_step(trainer)
        sync.push()
        assert sync.probe.results[-1].ok

        # Someone with access to the control plane reloads other weights, as the hostile process did
        # over TCP before: pause, reload (the base again: not the pushed version), reset, resume.
        client = server.client(120.0)
        assert client.post(server.url + "/pause", params={"mode": "wait"}).status_code == 200
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(server.dir / "model")}}
        assert client.post(server.url + "/collective_rpc", json=rpc).status_code == 200
        assert client.post(server.url + "/reset_prefix_cache").status_code == 200
        assert client.post(server.url + "/resume").status_code == 200
        client.close()

        _train_one_step(trainer)
        with pytest.raises(SyncVerificationError, match="changed without a push"):
            sync.push()
        assert engine.version == 1  # nothing pushed over the altered engine
    finally:
        engine.close()
    assert not folder.exists()
