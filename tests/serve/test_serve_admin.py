"""The admin guard on a real uvicorn server on loopback: every endpoint that is not public
needs the admin token (401 without it) and an allowed client address (403), a refused
call changes nothing, and turning the token off takes an explicit flag."""

from __future__ import annotations

import argparse

import httpx
import pytest
from fastapi.routing import APIRoute
from serve_helpers import running, save_model

from posttrain.commands.serve import build_config
from posttrain.configs.serve import AdminConfig, ServeConfig
from posttrain.errors import ConfigError
from posttrain.serve.auth import AdminGuard
from posttrain.serve.server import build_server

TOKEN = "s3cret-admin-token"
PUBLIC = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}
"""Endpoints any client may call; every other route of the app is an admin route."""


def _admin_routes(app) -> list[tuple[str, str]]:
    routes = [r for r in app.routes if isinstance(r, APIRoute) and r.path not in PUBLIC]
    return [(sorted(r.methods)[0], r.path) for r in routes]


def _call(url: str, method: str, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = {"path": "/nonexistent"} if path == "/v1/update_weights" else None
    return httpx.request(method, url + path, json=body, headers=headers, timeout=30)


def _weights(url: str) -> str:
    r = httpx.post(url + "/v1/completions", json={"model": "posttrain", "prompt": [4, 5], "max_tokens": 1})
    return r.json()["system_fingerprint"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("admin")
    return save_model(root / "m", "micro", seed=1), save_model(root / "m2", "micro", seed=2), root


def _server(models, monkeypatch, token: str | None = TOKEN, **admin):
    if token is None:
        monkeypatch.delenv("POSTTRAIN_ADMIN_TOKEN", raising=False)
    else:
        monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", token)
    return build_server(ServeConfig(model=str(models[0]), canary={"probe_domains": []}, admin=admin))


def test_the_app_has_the_admin_routes_it_should():
    app_routes = {p for _, p in _admin_routes(_bare_app())}
    assert {"/v1/update_weights", "/admin/state", "/admin/promote", "/admin/rollback", "/admin/check"} <= app_routes


def _bare_app():
    from posttrain.serve.app import Server, create_app

    return create_app(Server(ServeConfig(model="unused"), deployments=[lambda m: None]))  # routes only, never run


def test_every_admin_route_needs_the_token_and_refusals_change_nothing(models, monkeypatch):
    app = _server(models, monkeypatch)
    with running(app) as url:
        before = _weights(url)
        for method, path in _admin_routes(app):
            for token in (None, "wrong", TOKEN + "x", TOKEN[:-1], TOKEN.upper()):
                r = _call(url, method, path, token)
                assert r.status_code == 401, (method, path, token, r.text)
                assert r.json()["error"]["code"] == "invalid_admin_token"
                assert r.headers["www-authenticate"] == "Bearer"
            r = httpx.request(method, url + path, headers={"Authorization": TOKEN}, timeout=30)  # no scheme
            assert r.status_code == 401
        assert _weights(url) == before == "v0-w0"
        r = httpx.post(url + "/v1/update_weights", json={"path": str(models[1])}, headers={"X-Token": TOKEN})
        assert r.status_code == 401 and _weights(url) == "v0-w0"
        ok = _call(url, "POST", "/v1/update_weights", TOKEN)
        assert ok.status_code == 400  # authenticated: now the path itself is judged
        r = httpx.post(
            url + "/v1/update_weights", json={"path": str(models[1])}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert r.status_code == 200 and r.json()["weights"] == 1
        assert _weights(url) == "v0-w1"
        state = httpx.get(url + "/admin/state", headers={"Authorization": f"bearer {TOKEN}"}).json()
        assert state["loaded"]["v0"]["weights"] == 1


def test_a_client_outside_the_allowlist_gets_403_even_with_the_token(models, monkeypatch):
    app = _server(models, monkeypatch, allow_clients=["10.0.0.0/8"])  # loopback is not in it
    with running(app) as url:
        for method, path in _admin_routes(app):
            r = _call(url, method, path, TOKEN)
            assert r.status_code == 403 and r.json()["error"]["code"] == "client_not_allowed", (path, r.text)
        assert _weights(url) == "v0-w0"
        assert httpx.get(url + "/health").status_code == 200  # public endpoints are not guarded


def test_no_token_configured_refuses_admin_unless_insecure_flag(models, monkeypatch):
    app = _server(models, monkeypatch, token=None)
    with running(app) as url:
        for method, path in _admin_routes(app):
            r = _call(url, method, path, "anything")
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled", (path, r.text)
        assert _weights(url) == "v0-w0"
    app = _server(models, monkeypatch, token=None, auth=False)
    with running(app) as url:
        r = httpx.post(url + "/v1/update_weights", json={"path": str(models[1])})
        assert r.status_code == 200 and _weights(url) == "v0-w1"
    app = _server(models, monkeypatch, token=None, auth=False, allow_clients=["192.168.0.0/16"])
    with running(app) as url:  # --insecure-admin drops the token only, never the address check
        assert httpx.get(url + "/admin/state").status_code == 403


def test_token_file_wins_over_the_environment(models, monkeypatch, tmp_path):
    (tmp_path / "tok").write_text("  from-file\n")
    app = _server(models, monkeypatch, token="from-env", token_file=str(tmp_path / "tok"))
    with running(app) as url:
        assert _call(url, "GET", "/admin/state", "from-env").status_code == 401
        assert _call(url, "GET", "/admin/state", "from-file").status_code == 200


def test_unreadable_or_empty_token_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="admin token file"):
        AdminGuard(AdminConfig(token_file=str(tmp_path / "missing")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        AdminGuard(AdminConfig(token_file=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="CIDR"):
        AdminConfig(allow_clients=("localhost",))


def test_allowlist_addresses():
    guard = AdminGuard(AdminConfig(auth=False))
    assert guard.allowed("127.0.0.1") and guard.allowed("127.0.0.2") and guard.allowed("::1")
    assert guard.allowed("::ffff:127.0.0.1")  # an IPv4-mapped loopback client on a dual-stack socket
    for host in ("10.1.2.3", "192.168.1.1", "::ffff:10.0.0.1", "2001:db8::1", "testclient", "", None):
        assert not guard.allowed(host), host
    wide = AdminGuard(AdminConfig(auth=False, allow_clients=("10.0.0.0/8", "192.168.1.7")))
    assert wide.allowed("10.200.0.1") and wide.allowed("192.168.1.7") and not wide.allowed("127.0.0.1")


def test_cli_flags_set_the_admin_fields(tmp_path):
    def args(*extra: str) -> argparse.Namespace:
        p = argparse.ArgumentParser()
        sub = p.add_subparsers()
        from posttrain.commands.serve import add_parser

        add_parser(sub)
        return p.parse_args(["serve", "--model", "m", *extra])

    assert build_config(args()).admin == AdminConfig()
    cfg = build_config(args("--admin-token-file", str(tmp_path / "t"), "--insecure-admin"))
    assert cfg.admin.token_file == str(tmp_path / "t") and cfg.admin.auth is False
