"""What `mlflow run` shows for a wrong -P: one line in its own words, not `ampbench variant`'s usage."""

from __future__ import annotations

import pytest

from ampbench import cli


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--precision", "bogus"], "mlflow run: argument -P precision: invalid choice: 'bogus'"),
        (["--quick", "maybe"], "mlflow run: argument -P quick: yes or no, got 'maybe'"),
        (["--nosuch", "1"], "mlflow run: unrecognized arguments: -P nosuch=1 (the parameters: parallel, "),
    ],
)
def test_a_wrong_parameter_of_mlflow_run_is_one_line_in_its_words(monkeypatch, capsys, given, said):
    """Hostile passes P, R: `-P precision=fp16` or `-P nosuch=1` printed `ampbench variant`'s
    nine-line usage, in --options the user never typed (`--nosuch 1`)."""
    monkeypatch.setenv("MLFLOW_RUN_ID", "0123")
    with pytest.raises(SystemExit) as done:
        cli._parse(["variant", "--parallel", "single", *given])  # noqa: SLF001
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith(said) and err.count("\n") == 1, err


def test_outside_mlflow_run_a_wrong_option_keeps_the_usage(monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    with pytest.raises(SystemExit):
        cli._parse(["variant", "--parallel", "single", "--nosuch", "1"])  # noqa: SLF001
    err = capsys.readouterr().err
    assert err.startswith("usage: ampbench variant ") and "unrecognized arguments: --nosuch 1" in err


@pytest.mark.parametrize(("run_id", "given"), [("0123", "-P epochs=zero"), ("", "--epochs zero")])
def test_a_bad_value_of_an_option_is_named_as_it_was_given(monkeypatch, caplog, run_id, given):
    """Hostile passes P, R: `-P epochs=zero` was reported "(from --set 'train.epochs=zero')"."""
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    assert cli.main(["variant", "--parallel", "single", "--epochs", "zero"]) == cli.EXIT_USAGE
    assert "invalid configuration (params.yaml and the options given):" in caplog.text
    assert f"train.epochs: expected int, got str 'zero' (from {given})" in caplog.text, caplog.text
