"""Building the file domains a tasks config declares and registering them.

Invariant: a `tasks.domains` entry with a `source` becomes a registered
SourceDomain under its key, checked (every row parses, both splits have
rows) before training starts; a bad file or verifier is a TaskError or
ConfigError naming the domain, never a crash in the loop. A name already
taken by a built-in or plugin domain is an error naming both origins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posttrain.errors import ConfigError, PosttrainError, TaskError

if TYPE_CHECKING:
    from posttrain.byo.domain import SourceDomain
    from posttrain.configs.tasks import DomainSpec, TasksConfig


def source_domain(name: str, spec: DomainSpec, base_dir: str | None = None, check: bool = True) -> SourceDomain:
    """The SourceDomain of one `tasks.domains` entry (not registered)."""
    from posttrain.byo.domain import SourceDomain

    if spec.source is None:
        raise ConfigError(f"tasks.domains.{name}: no source")
    try:
        domain = SourceDomain(name, spec.source, spec.verifier, base_dir)
        if check:
            domain.check()
    except PosttrainError as exc:
        raise type(exc)(f"tasks.domains.{name}: {exc}") from None
    return domain


def rebuild(name: str, spec_json: str, base_dir: str | None) -> SourceDomain:
    """A file domain in a worker process, from the spec `register_sources` kept in the
    environment (the registry calls this by its import path; not checked again)."""
    from posttrain.configs.tasks import DomainSpec

    return source_domain(name, DomainSpec.model_validate_json(spec_json), base_dir, check=False)


def register_sources(config: TasksConfig, base_dir: str | None = None) -> list[str]:
    """Build and register every source domain of `config`; returns their names."""
    from posttrain.domains import registry

    names = []
    for name, spec in sorted(config.domains.items()):
        if spec.source is None:
            continue
        registry._load_builtin()
        old = registry._ORIGINS.get(name)
        if old is not None and not old.startswith("file "):
            raise TaskError(f"tasks.domains.{name}: the name is taken by {old}; a source domain needs its own name")
        domain = source_domain(name, spec, base_dir)
        registry.register(domain, domain.origin)
        registry.remember_source(name, f"{__name__}:rebuild", spec.model_dump_json(), base_dir)
        names.append(name)
    return names
