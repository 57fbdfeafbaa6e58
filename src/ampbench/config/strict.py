"""Reading ``params.yaml`` strictly and within bounds, and quoting its values briefly.

A params file is a few kB of plain YAML. What it may not be, each refused with one line naming the
file (and the line where there is one) and the fix:

- a second key of the same name in one mapping (a second ``train:`` section): YAML keeps the last
  one and silently drops the first's settings;
- an anchor or alias (``&x`` / ``*x``): nothing in the file needs them, and nested aliases expand
  to a billion values from a few lines (the "billion laughs");
- not a regular file (a FIFO would block the stage, a device never end), or over ``MAX_BYTES``;
- nested deeper than ``MAX_DEPTH`` (``[[[[...]]]]``): the YAML reader recurses once a level, so a
  few hundred levels in a short value end in Python's RecursionError.

``shown(value)`` quotes a value in an error message, cut to ``SHOWN_CHARS`` characters.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import yaml

from ampbench.config.settings import ConfigError

MAX_BYTES = 1_000_000  # params.yaml is ~6 kB
SHOWN_CHARS = 80
MAX_DEPTH = 20  # params.yaml nests 3 levels (section, key, a list of seeds)


def cut(text: str) -> str:
    """``text`` cut to at most SHOWN_CHARS characters (a cut one ends with '...')."""
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def shown(value: object) -> str:
    """``repr(value)``, cut to at most SHOWN_CHARS characters."""
    return cut(repr(value))


class _Refused(yaml.YAMLError):
    def __init__(self, what: str, mark) -> None:
        super().__init__(f"line {mark.line + 1}: {what}")
        self.what = what


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without anchors and aliases, without silently repeated keys, and shallow."""

    depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _Refused(
                f"YAML anchor or alias {sign}{cut(str(event.anchor))} is not allowed in a params "
                "file; write the values out",
                event.start_mark,
            )
        if self.depth >= MAX_DEPTH:
            raise _Refused(
                f"values nested more than {MAX_DEPTH} levels deep (lists or mappings inside each "
                "other); a setting is a number, a word or a short list",
                event.start_mark,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if (
                key_node.tag == "tag:yaml.org,2002:merge"
            ):  # hostile pass T: "could not determine a constructor"
                raise _Refused(
                    "YAML merge key << is not allowed in a params file; write the values out",
                    key_node.start_mark,
                )
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise _Refused(
                        f"key {shown(key)} appears twice in one mapping (first on line {seen[key]}); "
                        "YAML would keep only the last; merge them into one",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # Python refuses to read an integer of over 4300 digits
            raise _Refused(
                f"a number of {len(node.value):,} digits ({cut(node.value)}) is larger than any setting "
                "can be; write a smaller one",
                node.start_mark,
            ) from None
        _refuse_yaml11_only(node, value)
        return value

    def construct_yaml_float(self, node):
        value = super().construct_yaml_float(node)
        _refuse_yaml11_only(node, value)
        return value


def _refuse_yaml11_only(node, value) -> None:
    """Numbers this reader (YAML 1.1) and DVC's (YAML 1.2) read differently (hostile pass X2:
    `epochs: 010` trained 8 epochs while DVC recorded 10; `1:30` trained 90)."""
    digits = node.value.replace("_", "").lstrip("+-")
    if ":" in digits:
        what = f"{cut(node.value)} is a base-60 number ({cut(str(value))}) to YAML 1.1, text to DVC"
    elif digits[:2].lower() == "0b":
        what = f"{cut(node.value)} is a binary number ({cut(str(value))}) to YAML 1.1"
    elif isinstance(value, int) and len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        decimal = cut(str(int(node.value.replace("_", ""))))
        what = f"{cut(node.value)} is an octal number ({cut(str(value))}) to YAML 1.1, {decimal} to DVC"
    else:
        return
    fix = "write the number in decimal, without a leading 0; quote it if it is text"
    raise _Refused(f"{what}: {fix}", node.start_mark)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def parse_value(text: str) -> object:
    """One ``--set`` value read as the params file's values are (a yaml.YAMLError if it cannot be);
    a refusal's ``what`` says why without a line number."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader, stricter


# Where the path came from: params.yaml by default, or the command's --params (a stage's).
FIX = "restore params.yaml (`git checkout params.yaml`), or point --params at a params.yaml"


def fix_for(path: Path) -> str:
    """FIX for the project's params.yaml; for a file of the user's own (--params), not a `git
    checkout` of another file (hostile pass D)."""
    return FIX if Path(path).name == "params.yaml" else f"fix {path}, or point --params at another file"


def read_params(path: Path) -> object:
    """The parsed params file, or a ConfigError saying what is wrong with it."""
    fix = fix_for(path)
    _refuse_a_subfolder(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except FileNotFoundError:
        if os.path.islink(path):  # "not found" of a file that `ls` lists: say what it points at
            raise ConfigError(
                f"params file {path}: a link to {os.readlink(path)}, which does not exist; {fix}"
            ) from None
        if Path(path).name == "params.yaml" and not Path(path).parent.name:  # the default: where it is run
            if Path("dvc.yaml").is_file():  # the project's folder: its params.yaml is gone (hostile pass F)
                raise ConfigError(f"{path}: not found beside dvc.yaml; {FIX}") from None
            raise ConfigError(_not_in_a_project(path)) from None
        raise ConfigError(f"params file {path}: not found; check the path given to --params") from None
    except OSError as err:
        raise ConfigError(f"params file {path}: cannot be read ({err.strerror}); {fix}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"params file {path}: is a folder, not a file; {fix}")
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(  # not "fix /dev/zero" (hostile pass Z)
                f"params file {path}: is not a regular file (a pipe, device or socket); point --params at "
                "a YAML file such as the project's params.yaml"
            )
        data = _read_at_most(fd, MAX_BYTES + 1)  # a file growing meanwhile, or a size /proc does not tell
    except OSError as err:  # /proc/self/mem: EIO
        raise ConfigError(f"params file {path}: cannot be read ({err.strerror}); {fix}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ConfigError(
            f"params file {path}: larger than {MAX_BYTES // 1_000_000} MB ({max(info.st_size, len(data)):,} "
            f"bytes); a params file is a few kB: {fix}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        byte = err.object[err.start : err.start + 1]
        raise ConfigError(
            f"params file {path}: not UTF-8 text (byte {err.start}: {byte!r}); save it as UTF-8, or {fix}"
        ) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader, stricter
    except _Refused as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(_not_yaml(path, err)) from None


def _project_above(folder: Path) -> Path | None:
    """The nearest folder above ``folder`` that holds a dvc.yaml: the project it is inside."""
    return next((p for p in folder.resolve().parents if (p / "dvc.yaml").is_file()), None)


def _not_in_a_project(path: Path) -> str:
    """The default params.yaml missing outside a project's folder. Every command reads and writes
    data/, models/, reports/ and mlflow.db where it runs: in a subfolder of the project, --params
    would start a second project there (hostile pass H: "pass --params", then "run `ampbench
    download` first" beside the project's own prepared data)."""
    here, root = Path.cwd(), _project_above(Path.cwd())
    if root is not None:
        inside = f"a folder inside the project at {root}"
        return f"{path}: not found in {here}, {inside}; run ampbench from there (`cd {root}`)"
    return f"{path}: not found in {here}; run ampbench from the project's folder (the one holding dvc.yaml)"


def _refuse_a_subfolder(path: Path) -> None:
    """--params naming the params.yaml of a project the command runs inside of, from a subfolder
    (see _not_in_a_project)."""
    here = Path.cwd()
    with contextlib.suppress(OSError):
        home = Path(path).resolve().parent
        below = home in here.resolve().parents and not (here / "dvc.yaml").is_file()
        if below and (home / "dvc.yaml").is_file():
            raise ConfigError(
                f"--params {path}: the params of the project at {home}, run from its subfolder {here}: "
                f"ampbench reads and writes data/, models/ and reports/ where it runs; run it from {home} "
                f"(`cd {home}`)"
            )


def _not_yaml(path: Path, err: yaml.YAMLError) -> str:
    """Where and what, with the fix (hostile pass WARN: PyYAML's scanner text, "while scanning for
    the next token found character '\\t' that cannot start any token in "<unicode string>" ...")."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or not problem:
        return f"{path}: not valid YAML: {' '.join(str(err).split())[:300]}"
    hint = "indent with spaces, not tabs" if "'\\t'" in problem else "fix that line"
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return f"{path}: {where}: not valid YAML ({problem}); {hint}, or {fix_for(path)}"
