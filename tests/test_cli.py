"""Every registered subcommand resolves to a callable, and the fast commands stay free of Beam."""

import importlib
import subprocess
import sys

import pytest

from streameval.cli import COMMANDS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_registered_command_imports(name):
    module, func, _, _ = COMMANDS[name]
    assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if not c[2]))
def test_commands_without_beam_do_not_import_it(name):
    module, func, _, _ = COMMANDS[name]
    code = f"import sys, importlib; importlib.import_module({module!r}); print('apache_beam' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_trec_eval_all_trec_without_a_shared_query_is_exit_1(tmp_path, capsys):
    """A run and qrels with no query in common: every family of all_trec scores no list (Rndcg raised
    a numpy broadcasting error here), and the command says so with exit status 1, as trec_eval."""
    from streameval import cli

    (tmp_path / "run").write_text("q1 Q0 d1 0 0.0 tag\n")
    (tmp_path / "qrels").write_text("q2 0 d1 0\n")
    assert cli.main(["trec-eval", "-m", "all_trec", str(tmp_path / "qrels"), str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err.strip() == "streameval trec-eval: no queries with both results and judgments"
