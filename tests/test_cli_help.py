"""`slimserve --help` speaks to users: what slimserve does and its main commands, not the developer
docstring of slimserve/cli.py (which stays, for developers)."""

from __future__ import annotations

import pytest

from slimserve import cli


def test_help_describes_slimserve_and_its_main_commands(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    assert " ".join(cli.DESCRIPTION.split()) in text
    for command in ("slimserve up", "`build`", "`serve`", "`score`", "`bench`"):
        assert command in cli.DESCRIPTION, command
    assert "``" not in text and "thin layer" not in text  # no reStructuredText, no developer text
    assert cli.__doc__.startswith("The ``slimserve`` command line")
