"""Building a ready-to-run app from a ServeConfig.

Invariant: the lossy fast mode is never served for a plain model directory
(it has no release quality gate); only registry versions whose gate passed
serve int8 weights.
"""

from __future__ import annotations

import logging
from typing import Any

from posttrain.configs.serve import ServeConfig
from posttrain.errors import ConfigError
from posttrain.serve.app import Server, create_app
from posttrain.serve.metrics import ServeMetrics
from posttrain.serve.registry import ModelRegistry
from posttrain.serve.tiers import Deployment, deployment_of

log = logging.getLogger("posttrain.serve")


def model_dir_deployment(path: str, cfg: ServeConfig, name: str = "v0") -> Any:
    """A deferred builder of a deployment for one model directory (always lossless fast tier)."""
    from posttrain.model.arch import check_model_dir

    check_model_dir(path)
    if cfg.fast.mode == "int8":
        log.warning("fast.mode=int8 needs a registry version whose release gate passed; serving lossless")

    def build(metrics: ServeMetrics) -> Deployment:
        return deployment_of(path, name, cfg, "lossless", metrics)

    return build


def build_server(cfg: ServeConfig) -> Any:
    """The FastAPI app for `cfg` (a registry, a single model directory or a rule-based policy)."""
    if sum(bool(x) for x in (cfg.registry, cfg.model, cfg.policy)) > 1:
        raise ConfigError("serve: give one of --registry, --model and --policy")
    if cfg.policy:
        from posttrain.serve.policy import policy_app

        return policy_app(cfg)
    if cfg.registry:
        reg = ModelRegistry(cfg.registry)
        if reg.state().stable is None:
            raise ConfigError(f"registry {cfg.registry!r} has no stable version; run `posttrain release` first")
        return create_app(Server(cfg, registry=reg))
    if cfg.model:
        return create_app(Server(cfg, deployments=[model_dir_deployment(cfg.model, cfg)]))
    raise ConfigError("serve: give --registry, --model or --policy")
