"""The config's schema, read from its models: each field's type, default, bounds and docstring
(`posttrain config fields SECTION`). Docstrings are the string literal under each field in
its section's class body, read once from the source with `ast`."""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from posttrain.configs.section import did_you_mean
from posttrain.errors import ConfigError

_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "len >=", "max_length": "len <="}


@dataclass(frozen=True)
class FieldInfo:
    name: str
    type: str
    default: str
    bounds: str
    doc: str


def _docstrings(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:], strict=False):
            if not (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)):
                continue
            if isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
                out[a.target.id] = " ".join(b.value.value.split())
    return out


def _type_name(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    return text.replace("typing.", "").replace("posttrain.configs.", "").replace("NoneType", "None")


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation holds (itself, a union's members, an Annotated's inner type)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def fields(model: type[BaseModel]) -> list[FieldInfo]:
    """Every field of `model`: type, default, bounds and docstring."""
    docs = _docstrings(model)
    out = []
    for name, f in model.model_fields.items():
        if f.default is not PydanticUndefined:
            default = repr(f.default.model_dump() if isinstance(f.default, BaseModel) else f.default)
        elif f.default_factory is not None:
            made = f.default_factory()  # type: ignore[call-arg]
            default = repr(made.model_dump() if isinstance(made, BaseModel) else made)
        else:
            default = "(required)"
        bounds = []
        for meta in f.metadata:
            for attr, sign in _BOUNDS.items():
                value = getattr(meta, attr, None)
                if value is not None:
                    bounds.append(f"{sign} {value}")
        doc = docs.get(name) or f.description or ""
        out.append(FieldInfo(name, _type_name(f.annotation), default, ", ".join(bounds), doc))
    return out


def section_models(root: type[BaseModel], dotted: str) -> list[tuple[str, type[BaseModel]]]:
    """The model(s) at `dotted` (`trainer`, `trainer.loss`: a union gives each member), or a
    ConfigError naming the unknown part with a did-you-mean."""
    found: list[tuple[str, type[BaseModel]]] = [("", root)]
    for part in [p for p in dotted.split(".") if p]:
        nxt = []
        for label, model in found:
            f = model.model_fields.get(part)
            if f is not None:
                members = _models(f.annotation)
                nxt += [(m.__name__ if len(members) > 1 else label, m) for m in members]
        if not nxt:
            names = sorted({n for _, m in found for n in m.model_fields})
            raise ConfigError(
                f"{dotted}: no section {part!r}{did_you_mean(part, names)}; sections here: "
                + (", ".join(n for _, m in found for n, f in m.model_fields.items() if _models(f.annotation)))
            )
        found = nxt
    return found
