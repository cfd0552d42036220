"""Output into a pipe or a file is not an 80-column terminal: no value or URL is broken across lines."""

from __future__ import annotations

import subprocess
import sys

PRINT_LONG_LINES = """
from rich.table import Table
from sparkcluster.engine.console import out
out.print("serving at http://192.168.100.10:8000/v1 " + "x" * 150, highlight=False)
table = Table("node", "state", "bytes", "note")
table.add_row("spark-1", "complete", "1.07 GB", "y" * 120)
out.print(table)
"""


def test_a_pipe_gets_whole_lines_even_with_columns_exported():
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", PRINT_LONG_LINES], capture_output=True, text=True, env=env,
                         check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "serving at http://192.168.100.10:8000/v1 " + "x" * 150
    row = next(line for line in lines if "spark-1" in line)
    assert "1.07 GB" in row and "y" * 120 in row


def test_no_emoji_code_is_rendered_and_the_table_of_codes_is_not_imported():
    # A host, path or log line that holds `:fire:` prints as it is; rich's table of codes stays unimported.
    code = ("import sys\nfrom sparkcluster.engine.console import out, err\n"
            "out.print('host :fire: at fe80::1:2 [bold]x[/bold]', highlight=False)\n"
            "err.print(':smile: done', highlight=False)\n"
            "print('rich._emoji_codes' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["host :fire: at fe80::1:2 x", "False"]
    assert done.stderr == ":smile: done\n"
