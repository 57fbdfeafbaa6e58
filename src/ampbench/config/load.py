"""Reading ``params.yaml``: the YAML, the ``--set`` overrides, each value against its field's type.

``load_config`` collects every problem before it reports: unknown keys, wrong
types, then the ranges and bounds of ``config/rules.py``, all in one ConfigError.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import typing
from dataclasses import fields
from pathlib import Path

import yaml

import ampbench.config.rules as config_rules
from ampbench.config.settings import COMPILE_MODES, CONDITIONS, LOADERS, SWITCHES, Config, ConfigError
from ampbench.config.strict import cut, fix_for, parse_value, read_params, shown
from ampbench.output import hide_credentials

# The largest integer a setting may hold (a C long): beyond it no count makes sense.
INT_LIMIT = 2**63 - 1
MAX_PROBLEMS = 20  # lines of one configuration error

# Keys whose text is one of a few words: a YAML boolean given for one is told them (pass O WARN).
_CHOICES = {
    "tracking.system_metrics": SWITCHES,
    "tracking.conditions": CONDITIONS,
    "train.loader": LOADERS,
    "train.compile": COMPILE_MODES,
}

# Keys whose value is text even when YAML reads it as a number (an all-digit checksum).
_TEXT_KEYS = ("data.sha256",)


# Keys earlier versions had, with what replaced them (an old params.yaml gets told, not just refused).
_REMOVED = {
    "train.amp_dtype": "removed: each precision carries its dtype (autocast and autocast_gradscaler: "
    "float16 on CUDA; autocast_bf16: bfloat16); delete the line and add autocast_bf16 to "
    "variants.precision (or pass --precision autocast_bf16) for bfloat16",
}


# Keys that were true/false in earlier versions, with what each boolean became.
_WERE_BOOLEAN = {
    "tracking.log_model": "is no longer true/false: write export (what true logged: a servable "
    "torch.export program), reference (the default: the Models tab points at "
    "models/<variant>/seed-<s>/model.pt, no copy of the weights) or none (what false did)",
}


def _check_value(key: str, value: object, hint: typing.Any, problems: list[str]) -> object:
    """Coerce/validate one value against its annotation; append a message on failure."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or not value:
            problems.append(f"{key}: expected a non-empty list, got {shown(value)}")
            return value
        return tuple(_check_value(f"{key}[{i}]", v, int, problems) for i, v in enumerate(value))
    if key in _WERE_BOOLEAN and isinstance(value, bool):
        problems.append(f"{key}: {shown(value)} {_WERE_BOOLEAN[key]}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            problems.append(f"{key}: expected true or false, got {shown(value)}")
        return value
    if hint is float:
        given, value = value, _as_float(value)
        if isinstance(value, float) and not math.isfinite(value):
            # inf passes every `> 0` check, then overflows timers or means "never" without a word
            huge = isinstance(given, int)  # an integer beyond float's range: shown as written
            problems.append(f"{key}: expected a finite number, got {shown(given if huge else value)}")
            return value
    if key in _TEXT_KEYS and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # YAML read an all-digit checksum as a number
    if hint is str and isinstance(value, dict) and len(value) == 1 and None in value.values():
        # `--set model.name=torchvision:` (hostile pass WARN: "expected str, got dict")
        text = f"{next(iter(value))}:"
        problems.append(
            f"{key}: {text!r} reads as a YAML mapping, not text, as it ends in a colon: write what comes "
            f"after the colon (e.g. torchvision:resnet18), or quote it"
        )
        return value
    if hint is str and isinstance(value, bool) and key in _CHOICES:
        # yes/no/on/off read as YAML booleans, and "expected str, got bool" names no word that works
        words = ", ".join(_CHOICES[key])
        problems.append(f"{key}: {shown(value)} reads as a YAML boolean, not text: write one of {words}")
        return value
    if hint is str and isinstance(value, datetime.date):  # hostile pass X2 WARN: "got date"
        problems.append(f"{key}: {value} reads as a YAML date, not text: quote it ('{value}')")
        return value
    if not isinstance(value, hint) or isinstance(value, bool) and hint is not bool:
        problems.append(f"{key}: expected {hint.__name__}, got {type(value).__name__} {shown(value)}")
    elif hint is int and abs(value) > INT_LIMIT:  # no count is that large; the rules' arithmetic breaks
        problems.append(f"{key}: {shown(value)} is larger than any setting can be (at most {INT_LIMIT:,})")
    return value


def _as_float(value: object) -> object:
    """Ints and numeric strings as float (YAML 1.1 reads `1e6`, without a dot, as a string); an
    int beyond float's range as inf (then refused as not finite)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value) if abs(value) <= INT_LIMIT else math.inf
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _build(cls: typing.Any, raw: object, prefix: str, problems: list[str]):
    if not isinstance(raw, dict):
        problems.append(f"{prefix.rstrip('.') or 'params'}: expected a mapping, got {shown(raw)}")
        return cls()
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in raw:
        if f"{prefix}{key}" in _REMOVED:
            problems.append(f"{prefix}{key}: {_REMOVED[prefix + key]}")
        elif key not in known:
            listed = known | ({"variants"} if not prefix else set())  # read before: the DVC matrix
            close = difflib.get_close_matches(str(key), listed, n=1)
            guess = f"did you mean {prefix}{close[0]}? " if close else ""
            names = ", ".join(sorted(listed))
            problems.append(f"{cut(f'{prefix}{key}')}: unknown key ({guess}known: {names})")
    values = {}
    for f in fields(cls):
        if f.name in raw:
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                values[f.name] = _build(hint, raw[f.name], f"{prefix}{f.name}.", problems)
            else:
                before = len(problems)
                value = _check_value(prefix + f.name, raw[f.name], hint, problems)
                if len(problems) == before:  # a mistyped value keeps the default: ranges still run
                    values[f.name] = value
    return cls(**values)


def _apply_override(raw: dict, item: str, problems: list[str]) -> None:
    key, sep, text = item.partition("=")
    if not sep or "." not in key:
        problems.append(f"--set {shown(item)}: expected section.key=value, e.g. train.epochs=1")
        return
    section, name = key.strip().split(".", 1)
    try:
        value = parse_value(text) if text.strip() else ""
    except yaml.YAMLError as err:
        where = f"from --set {shown(item)} or a command-line option"
        if refusal := getattr(err, "what", None):  # the strict loader's own: an anchor, a huge number
            problems.append(f"{cut(key.strip())}: {refusal} ({where})")
            return
        problem = getattr(err, "problem", None) or type(err).__name__  # e.g. "expected ',' or ']'"
        problems.append(
            f"{cut(key.strip())}: {shown(text)} is not valid YAML ({problem}); write a list as [0, 1], "
            f"quote text that starts with @, `, [ or {{ ({where})"
        )
        return
    raw.setdefault(section, {})
    if isinstance(raw[section], dict):
        raw[section][name] = value


def load_config(path: str | Path = "params.yaml", overrides: typing.Iterable[str] = ()) -> Config:
    """Read params.yaml, apply `section.key=value` overrides, validate; raise ConfigError."""
    path, overrides = Path(path), list(overrides)
    raw = _read_params(path)
    problems: list[str] = []
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for item in overrides:
        _apply_override(raw, item, problems)
    if "variants" in raw:  # the DVC matrix axes, read by dvc.yaml only: validated, then dropped
        problems += config_rules.variant_problems(raw.pop("variants"))
    cfg = _build(Config, raw, "", problems)
    # Every field is well typed here, so the ranges run on all of them: all problems come out together.
    problems += config_rules.problems(cfg)
    if problems:  # at most MAX_PROBLEMS lines: a file of 50,000 unknown keys is not 50,000 lines
        problems = [_with_source(problem, overrides) for problem in problems]
        more = len(problems) - MAX_PROBLEMS
        lines = "\n  ".join(problems[:MAX_PROBLEMS] + ([f"... and {more:,} more"] if more > 0 else []))
        where = f"{path} and --set overrides" if overrides else str(path)
        raise ConfigError(f"invalid configuration ({where}):\n  {lines}")
    return cfg


def _with_source(problem: str, overrides: typing.Iterable[str]) -> str:
    """The problem, with the --set that gave its value where one did (hostile pass WARN: a bad
    `--set train.epochs=ten` read exactly as the same value in params.yaml): the last one wins."""
    if "--set" in problem:
        return problem
    for item in reversed(list(overrides)):
        key = item.partition("=")[0].strip()
        if key and problem.startswith((f"{key}:", f"{key}[")):
            return f"{problem} (from --set {shown(hide_credentials(item))})"
    return problem


def _read_params(path: Path) -> dict:
    """The parsed params file as a non-empty mapping, or a ConfigError saying what is wrong with it."""
    raw = read_params(path)
    if raw is None or raw == {}:
        # Running on code defaults would silently train the full study (and download CIFAR-10).
        raise ConfigError(f"params file {path}: holds no settings (empty or only comments); {fix_for(path)}")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: expected a mapping at the top level (section: then its keys), got "
            f"{type(raw).__name__}; {fix_for(path)}"
        )
    return raw
