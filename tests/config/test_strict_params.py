"""params.yaml is read strictly and within bounds (config/strict.py): no repeated keys, no YAML
anchors or aliases, a regular file of at most 1 MB; values quoted in errors are short."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ampbench.config import ConfigError, load_config
from ampbench.config.strict import MAX_BYTES, SHOWN_CHARS
from conftest import REPO


def _params(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


def test_a_second_section_of_the_same_name_is_refused_naming_key_and_lines(tmp_path):
    text = (REPO / "params.yaml").read_text() + "\ntrain:\n  epochs: 1\n"
    second = text.count("\n") - 1  # the line of the second `train:`
    with pytest.raises(ConfigError) as err:
        load_config(_params(tmp_path, text))
    line = _one_line(err)
    assert "'train' appears twice" in line and f"line {second}:" in line, line
    assert "first on line" in line


def test_a_repeated_key_inside_a_section_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"line 3: key 'lr' appears twice .*first on line 2"):
        load_config(_params(tmp_path, "train:\n  lr: 0.1\n  lr: 0.2\n"))


@pytest.mark.parametrize(
    "text",
    [
        "train: &t\n  lr: 0.1\nmodel: *t\n",
        # the billion laughs: a few lines that expand to 10**9 values
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{c}: &{c} [{', '.join(['*' + chr(ord(c) - 1)] * 10)}]\n" for c in "bcdefghi"),
    ],
)
def test_yaml_anchors_and_aliases_are_refused(tmp_path, text):
    with pytest.raises(ConfigError, match=r"line 1: YAML anchor or alias &\w+ is not allowed") as err:
        load_config(_params(tmp_path, text))
    _one_line(err)


def test_a_yaml_merge_key_is_refused_in_one_line(tmp_path):
    """Hostile pass T: `<<: {lr: 0.1}` said "could not determine a constructor for the tag
    'tag:yaml.org,2002:merge'"."""
    with pytest.raises(ConfigError, match=r"line 2: YAML merge key << is not allowed") as err:
        load_config(_params(tmp_path, "train:\n  <<: {lr: 0.1}\n  epochs: 1\n"))
    _one_line(err)


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("010", "010 is an octal number (8) to YAML 1.1, 10 to DVC"),
        ("1:30", "1:30 is a base-60 number (90) to YAML 1.1, text to DVC"),
        ("0b11", "0b11 is a binary number (3) to YAML 1.1"),
    ],
)
def test_a_number_yaml_11_and_dvc_read_differently_is_refused(tmp_path, written, said):
    """Hostile pass X2: `epochs: 010` trained 8 epochs while DVC recorded 10 (exit 0); `1:30`
    trained 90. In params.yaml and in --set alike."""
    with pytest.raises(ConfigError, match=rf"line 3: {re.escape(said)}: write the number in decimal") as err:
        load_config(_params(tmp_path, f"train:\n  lr: 0.2\n  epochs: {written}\n"))
    _one_line(err)
    with pytest.raises(ConfigError, match=rf"train.epochs: {re.escape(said)}.*from --set"):
        load_config(_params(tmp_path, "train:\n  epochs: 2\n"), [f"train.epochs={written}"])
    assert load_config(_params(tmp_path, "train:\n  lr: 007.5\n  epochs: 0x10\n")).train.epochs == 16


def test_a_params_file_over_1_mb_is_refused_unread(tmp_path):
    path = _params(tmp_path, "train:\n  epochs: 1\n" + "#" * MAX_BYTES + "\n")
    with pytest.raises(ConfigError, match="larger than 1 MB") as err:
        load_config(path)
    _one_line(err)


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "params.fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(ConfigError, match="not a regular file") as err:
            load_config(path)
        assert f"fix {path}" not in str(err.value) and "point --params at a YAML file" in str(err.value)


def test_values_quoted_in_errors_are_cut_to_80_characters(tmp_path):
    long = "x" * 1000  # YAML's longest plain key: 1024 characters
    path = _params(tmp_path, f"train:\n  loader: {long}\n  epochs: '{long}'\n  {long}: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, [f"train.lr={long}", f"{long}"])
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 5, lines
    for line in lines:
        assert "x" * (SHOWN_CHARS + 1) not in line and "..." in line, line


def test_an_experiment_name_longer_than_mlflow_keeps_is_refused_naming_the_key():
    """Hostile re-run: a 900 KB tracking.experiment was reported as a failing MLflow store."""
    with pytest.raises(ConfigError, match=r"tracking.experiment: 'e+\.\.\. must be at most 492 characters"):
        load_config(REPO / "params.yaml", ["tracking.experiment=" + "e" * 493])
    load_config(REPO / "params.yaml", ["tracking.experiment=" + "e" * 492])


def test_a_number_of_thousands_of_digits_is_refused_naming_the_line(tmp_path):
    # Python reads no integer of over 4300 digits: the error named neither key nor file
    path = _params(tmp_path, "train:\n  epochs: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    line = _one_line(err)
    assert f"{path}: line 2: a number of 5,000 digits" in line and "smaller" in line, line
    assert len(line) < 400, line


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("train.epochs=" + "9" * 5000, "train.epochs: a number of 5,000 digits"),
        ("model.fc_dim=" + "9" * 4000, "model.fc_dim: 999"),  # the memory rule's arithmetic broke
        ("train.seeds=[0, " + "9" * 30 + "]", "train.seeds[1]: 999"),
        ("train.lr=" + "9" * 400, "train.lr: expected a finite number, got 999"),
    ],
)
def test_a_huge_number_from_set_is_refused_naming_the_key(override, named):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "params.yaml", [override])
    text = str(err.value)
    assert named in text and len(text) < 600, text
    assert "set_int_max_str_digits" not in text


@pytest.mark.parametrize("where", ["file", "set"])
def test_values_nested_hundreds_deep_are_one_line_not_a_recursion_error(tmp_path, where):
    """Hostile pass: '[' * 400 (an 800-byte value) gave a RecursionError of ~3,000 lines."""
    deep = "[" * 5000 + "]" * 5000
    path = _params(tmp_path, "train:\n  lr: " + deep + "\n") if where == "file" else REPO / "params.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(path, ["train.lr=" + deep] if where == "set" else [])
    text = str(err.value)
    assert "values nested more than 20 levels deep" in text, text
    assert ("train.lr" if where == "set" else f"{path}: line 2") in text, text
    assert len(text) < 600, text


def test_the_shipped_params_nest_well_within_the_bound():
    load_config(REPO / "params.yaml", ["train.seeds=[0, 1]", "variants.parallel=[single]"])


def test_thousands_of_unknown_keys_are_twenty_lines_and_a_count(tmp_path):
    """Hostile pass: 50,000 unknown keys gave 50,001 lines, each listing every known key."""
    path = _params(tmp_path, "train:\n" + "".join(f"  k{i}: 1\n" for i in range(5000)))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = str(err.value).splitlines()
    assert len(lines) == 22 and lines[-1] == "  ... and 4,980 more", lines[-3:]


def test_a_params_file_that_fails_to_read_is_one_line():
    """Hostile pass: `--params /proc/self/mem` (EIO on read) gave a 23-line traceback."""
    with pytest.raises(ConfigError) as err:
        load_config(Path("/proc/self/mem"))
    assert "params file /proc/self/mem: cannot be read (Input/output error)" in _one_line(err)


@pytest.mark.parametrize(
    "url",
    ["http://me:s3cret@127.0.0.1:18731/x.tar.gz", "https://me:s3cret@example.com/x.tar.gz", "ftp://me@h/x"],
)
def test_credentials_in_the_data_url_are_refused_with_the_password_hidden(url):
    """Hostile pass P: urllib sends no credentials; the download was retried three times as a
    failed name lookup, then blamed on a local server that was up, the password in 4 lines."""
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "params.yaml", [f"data.url={url}"])
    said = str(err.value)
    assert "holds a user name or password" in said and "set data.url to its path" in said
    assert "s3cret" not in said and "***@" in said
    load_config(REPO / "params.yaml", ["data.url=https://example.com/a@b/x.tar.gz"])  # @ in the path


def test_a_date_where_text_goes_says_to_quote_it(tmp_path):
    """Hostile pass X2 WARN: `--set tracking.experiment=2026-12-07` said "expected str, got date"."""
    said = r"tracking.experiment: 2026-12-07 reads as a YAML date, not text: quote"
    with pytest.raises(ConfigError, match=said):
        load_config(_params(tmp_path, "train:\n  epochs: 2\n"), ["tracking.experiment=2026-12-07"])
    quoted = load_config(_params(tmp_path, "tracking:\n  experiment: '2026-12-07'\n"))
    assert quoted.tracking.experiment == "2026-12-07"


@pytest.mark.parametrize(
    ("override", "words"),
    [("tracking.system_metrics=yes", "auto, always, never"), ("train.compile=off", "none, default")],
)
def test_a_yaml_boolean_for_a_word_names_the_words(tmp_path, override, words):
    """Session 21 WARN: `--set tracking.system_metrics=yes` said "expected str, got bool True",
    naming none of the words that work; yes/no/on/off are YAML booleans."""
    with pytest.raises(ConfigError) as err:
        load_config(_params(tmp_path, "train:\n  epochs: 2\n"), [override])
    assert "reads as a YAML boolean, not text: write one of " + words in str(err.value)


def test_the_error_names_the_overrides_only_where_there_were_some(tmp_path):
    """Hostile pass P WARN: "invalid configuration (params.yaml and --set overrides)" with no --set;
    and a list at the top level said what it got, not how to fix it."""
    bad = _params(tmp_path, "train:\n  epochs: 0\n")
    with pytest.raises(ConfigError, match=r"^invalid configuration \(\S*params.yaml\):"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"^invalid configuration \(\S*params.yaml and --set overrides\):"):
        load_config(bad, iter(["train.lr=0.1"]))  # a one-pass iterable, read twice
    with pytest.raises(ConfigError, match=r"got list; restore params.yaml"):
        load_config(_params(tmp_path, "- train\n- epochs\n"))
