"""What `ampbench <command> --help` and a wrong option show (hostile pass WARNs: `compare --help`
and `evaluate --help` had no description; `compare --bogus` printed the top-level usage)."""

from __future__ import annotations

import pytest

from ampbench import cli


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_commands_help_says_what_it_does(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ampbench {command} ")
    description = out.split("\n\n")[1]
    assert not description.startswith("options:") and description[:1].isupper(), out
    # session 21 WARN: `findings --help` began "Docs/FINDINGS.md:", a path capitalised
    assert "/" not in description.split()[0], description


def test_an_option_the_command_does_not_take_shows_that_commands_usage(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["compare", "--bogus"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ampbench compare ") and err.endswith(
        "ampbench compare: error: unrecognized arguments: --bogus\n"
    ), err
