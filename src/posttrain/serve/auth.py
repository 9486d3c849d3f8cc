"""Who may change what is served: the weight-update and admin endpoints' guard.

Invariant: a request reaches a guarded endpoint's handler only when its client
address is in `admin.allow_clients` (else 403) and, with `admin.auth` on (the
default), it carries `Authorization: Bearer <token>` equal to the configured
admin token, compared in constant time (else 401). With `admin.auth` on and no
token configured, every guarded endpoint is refused (403): turning the check
off takes the explicit `admin.auth: false` (`posttrain serve --insecure-admin`).
A refused request changes nothing. The token is read once, when the server is
built, from `admin.token_file` or the POSTTRAIN_ADMIN_TOKEN environment variable.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from fastapi import Request

from posttrain.configs.serve import ADMIN_TOKEN_ENV, AdminConfig, admin_token
from posttrain.serve.protocol import ApiError

log = logging.getLogger("posttrain.serve")


class AdminGuard:
    """Checks one request against the admin credential and the client allowlist."""

    def __init__(self, cfg: AdminConfig) -> None:
        self.auth = cfg.auth
        self.token = admin_token(cfg.token_file) if cfg.auth else None
        self.networks = [ipaddress.ip_network(n, strict=False) for n in cfg.allow_clients]
        if not cfg.auth:
            log.warning("admin endpoints need no token (admin.auth=false / --insecure-admin)")
        elif self.token is None:
            log.warning(
                "no admin token (%s or admin.token_file): /v1/update_weights and /admin/* are refused", ADMIN_TOKEN_ENV
            )

    def allowed(self, host: str | None) -> bool:
        """Whether a client address is in the allowlist (an unknown or unparsable one never is)."""
        if host is None:
            return False
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr in net for net in self.networks)

    def check(self, request: Request) -> None:
        """Return when `request` may use an admin endpoint; raise the 403 or 401 ApiError otherwise."""
        host = request.client.host if request.client else None
        if not self.allowed(host):
            raise ApiError(
                403,
                f"admin endpoints do not accept client {host!r} (serve.admin.allow_clients)",
                "permission_error",
                code="client_not_allowed",
            )
        if not self.auth:
            return
        if self.token is None:
            raise ApiError(
                403,
                f"admin endpoints are disabled: no admin token is configured (set {ADMIN_TOKEN_ENV} or "
                "serve.admin.token_file / --admin-token-file, or start with --insecure-admin)",
                "permission_error",
                code="admin_disabled",
            )
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise ApiError(
                401,
                "admin endpoints need the admin token as 'Authorization: Bearer <token>'; "
                "it is missing or does not match",
                "authentication_error",
                code="invalid_admin_token",
                headers={"WWW-Authenticate": "Bearer"},
            )
