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
