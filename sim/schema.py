"""The pieces every pydantic input model shares: field types that say what they accept,
mappings that refuse unknown fields, and one-line errors.

The cluster file's models (:mod:`sim.cluster_schema`) and the search-space file's
(:mod:`dse.schema`) are built from these. A :class:`pydantic.ValidationError` becomes one
:class:`~sim.errors.InputError` naming the field path (``nodes[0].instances[1].npu_mem.
mem_util``) and what is allowed, as every other input error. Imported only where an input
is validated: pydantic costs about 0.2 s to import and build the models.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from sim.errors import MAX_NUMBER, InputError

#: a field given as null takes its default, as if absent
DEFAULT = object()


def allowed(names) -> str:
    return ", ".join(str(n) for n in names)


def fail(message: str) -> PydanticCustomError:
    """The error a validator raises: ``message`` is what the user reads after the path."""
    return PydanticCustomError("input", "{m}", {"m": message})


@dataclass(frozen=True)
class Rule:
    """What a field accepts, in words (for the field reference)."""

    text: str


def _limit(v: float) -> str:
    return f"{v:.15g}"


def check_number(v: Any, *, integer: bool = False, minimum: float | None = None,
                 exclusive: bool = False, maximum: float | None = None) -> int | float:
    """``v`` as an int (``integer``; 4.0 reads as 4) or a float, or the reason it is not."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise fail(f"must be {'an integer' if integer else 'a number'}, got {v!r}")
    if not math.isfinite(v):
        raise fail(f"must be a number, got {v!r}; allowed: finite numbers")
    if integer and int(v) != v:
        raise fail(f"must be an integer, got {v!r}")
    if maximum is not None and v > maximum:
        raise fail(f"must be <= {_limit(maximum)}, got {v!r}")
    if abs(v) > MAX_NUMBER:
        raise fail(f"must be <= 1e15, got {v!r}")
    if minimum is not None and (v <= minimum if exclusive else v < minimum):
        raise fail(f"must be {'>' if exclusive else '>='} {_limit(minimum)}, got {v!r}")
    return int(v) if integer else float(v)


def num(*, integer: bool = False, minimum: float | None = None, exclusive: bool = False,
        maximum: float | None = None, required: bool = False) -> Any:
    """A finite number (an integer where ``integer``), |v| <= 1e15, above ``minimum``
    (``exclusive``: strictly), at most ``maximum``; null takes the default."""
    def check(v: Any) -> Any:
        if v is None:
            if required:
                raise fail("required")
            return DEFAULT
        return check_number(v, integer=integer, minimum=minimum, exclusive=exclusive,
                            maximum=maximum)

    text = "integer" if integer else "number"
    if minimum is not None:
        text += f" {'>' if exclusive else '>='} {_limit(minimum)}"
    if maximum is not None:
        text += f", <= {_limit(maximum)}"
    return Annotated[Any, BeforeValidator(check), Rule(text)]


def names_of(values: tuple | Callable[[], list]) -> list:
    return list(values()) if callable(values) else list(values)


def choice(values: tuple | Callable[[], list], text: str = "") -> Any:
    """One of ``values`` (a tuple, or a function returning the names: a registry); null
    takes the default."""
    def check(v: Any) -> Any:
        if v is None:
            return DEFAULT
        names = names_of(values)
        if not isinstance(v, (str, int, float, bool)) or v not in names:
            raise fail(f"must be one of {allowed(names)}, got {v!r}")
        return v

    text = text or "one of " + allowed(values if not callable(values) else values())
    return Annotated[Any, BeforeValidator(check), Rule(text)]


def _bool_check(v: Any) -> Any:
    if v is None:
        return DEFAULT
    if not isinstance(v, bool):
        raise fail(f"must be true or false, got {v!r}")
    return v


Bool = Annotated[Any, BeforeValidator(_bool_check), Rule("true or false")]


def text(*, required: bool = False) -> Any:
    """A non-empty string; null takes the default (``required``: refused)."""
    def check(v: Any) -> Any:
        if v is None:
            if required:
                raise fail("required")
            return DEFAULT
        if not isinstance(v, str) or not v:
            raise fail(f"must be a non-empty string, got {v!r}")
        return v

    return Annotated[Any, BeforeValidator(check), Rule("a non-empty string")]


Text = text()


class Section(BaseModel):
    """A mapping of known fields; null fields take their defaults."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _null_is_default(self):
        return fill_defaults(self)


def fill_defaults(model: BaseModel) -> BaseModel:
    """``model`` with its null fields set to their defaults (a subclass's own after-validator
    calls it first: the order of after-validators is not the subclass's to choose)."""
    for name, f in type(model).model_fields.items():
        if getattr(model, name) is DEFAULT:
            object.__setattr__(model, name, f.get_default(call_default_factory=True))
    return model


# ---------------------------------------------------------------- errors
def validate(model: type[BaseModel], data: Any, where: str = "", *,
             source: str | None = None) -> Any:
    """``model`` validated from ``data``, or one InputError naming the field path (under
    ``where``, in the file ``source``) and what is allowed."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, model, where, source) from None


def _unwrap(ann: Any) -> Any:
    """``ann`` without ``Annotated`` and ``| None``: the model or container it reads."""
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = args[0] if len(args) == 1 else ann
    return ann


def annotation_at(model: type[BaseModel], loc: tuple) -> Any:
    """What reads the value at ``loc`` below ``model``: a model, a container, a type; None
    where ``loc`` leaves the models."""
    ann: Any = model
    for part in loc:
        ann = _unwrap(ann)
        origin = typing.get_origin(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = ann.model_fields.get(str(part))
            if field is None:
                return None
            ann = field.annotation
        elif origin in (list, tuple) and isinstance(part, int):
            ann = typing.get_args(ann)[0]
        elif origin is dict:
            ann = typing.get_args(ann)[1]
        else:
            return None
    return _unwrap(ann)


def model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model that reads the mapping at ``loc`` below ``model``."""
    ann = annotation_at(model, loc)
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def path_of(where: str, loc: tuple) -> str:
    """``where`` + ``loc`` as a user writes it: ``nodes[0].instances[1].npu_mem``."""
    out = where
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_MESSAGES = {"list_type": "must be a list", "too_short": "must be a non-empty list",
             "dict_type": "must be a mapping", "missing": "required"}


def input_error(exc: ValidationError, model: type[BaseModel], where: str = "",
                source: str | None = None) -> InputError:
    """The first error of ``exc`` as one line: path, then what is wrong and allowed."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
    kind = err["type"]
    if kind == "extra_forbidden":
        path = path_of(where, loc[:-1])
        fields = model_at(model, loc[:-1]).model_fields
        msg = f"unknown field {str(loc[-1])!r}; allowed: {allowed(fields)}"
    elif kind in ("model_type", "model_attributes_type") or (
            kind == "dict_type" and model_at(model, loc) is not None):
        path = path_of(where, loc)
        sub = model_at(model, loc)
        fields = allowed(sub.model_fields) if sub is not None else "(a mapping)"
        msg = f"must be a mapping with fields {fields}"
    else:
        path = path_of(where, loc)
        msg = _MESSAGES.get(kind, err["msg"])
    return InputError(f"{path}: {msg}" if path else msg, source=source)


def field_rule(f) -> str:
    """A field's :class:`Rule` text ("" where it has none)."""
    return next((m.text for m in f.metadata if isinstance(m, Rule)), "")


def reference_default(f) -> Any:
    """The default a field reference shows (None: required, or a mapping's own)."""
    return None if f.is_required() else f.get_default(call_default_factory=False)
