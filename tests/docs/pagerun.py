"""Run one manual page as a reader pastes it: ``python -m tests.docs.pagerun PAGE REPORT``.

The docs test (tests/docs/test_manual.py) starts one such process per page, in a fresh
temporary directory with a fresh ``REGISTRY_HOME``. Blocks run in page order and share one
namespace, the ``__main__`` of this process, as a script or a REPL session would:

- ``python``: run by pytest-examples (each block a ``__main__`` module carrying the page's names;
  a failure's traceback names the page's lines). A block with ``#>`` lines has the output of its
  ``print`` calls checked against them (pytest-examples' convention); ``expr  # -> VALUE`` and
  ``name = expr  # -> VALUE`` check ``repr`` of the value against ``VALUE``, and
  ``print(...)  # -> TEXT`` what it printed (the comment may stand on the next line).
- ``pycon``: run by :mod:`doctest`, every output shown checked.
- ``bash``: run by ``bash -e`` (no ``pipefail``: a reader's shell has none, and ``| head``
  would fail it); it must exit 0.
- ``console``: each ``$ command`` runs in bash; the lines shown under it, if any, are checked
  against what it printed (stdout and stderr), and a command with none shown must exit 0.

In every check ``…`` (or ``...``) stands for any text. The report (JSON) says which blocks ran
and, for a failure, the block's line and why.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import io
import json
import linecache
import os
import re
import subprocess
import sys
import tempfile
import tokenize
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.docs.blocks import Block, page_blocks

_EXPECT = re.compile(r"#\s*->\s?(?P<value>.*?)\s*$")
_ELLIPSIS = re.compile(r"…|\.\.\.")


class BlockFailed(Exception):
    """A block that did not run, or whose shown output was not what it printed."""


def matches(shown: str, actual: str) -> bool:
    """Whether ``actual`` is ``shown`` with each ``…``/``...`` standing for any text (blank
    space at line ends and around the whole ignored)."""
    def norm(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip().splitlines())
    pattern = ".*?".join(re.escape(part) for part in _ELLIPSIS.split(norm(shown)))
    return re.fullmatch(pattern, norm(actual), re.S) is not None


def _expect_printed(call: Callable[[], Any], shown: str, line: int) -> None:
    """``print(...)  # -> TEXT``: what the call printed is ``TEXT``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    sys.stdout.write(out.getvalue())
    if not matches(shown, out.getvalue()):
        raise BlockFailed(f"line {line} shows `# -> {shown}` but it printed {out.getvalue()!r}")


def _expect(value: Any, shown: str, line: int) -> None:
    actual = repr(value)
    if not matches(shown, actual):
        raise BlockFailed(f"line {line} shows `# -> {shown}` but the value is {actual}")


def with_value_checks(source: str, first_line: int = 0) -> str:
    """``source`` with each ``# -> VALUE`` comment turned into a check of the statement it ends
    (an expression, or an assignment to one name), on the same lines so tracebacks still point
    at the page. A comment alone on its line shows the statement on the line above.
    ``first_line`` is the page's line before the block's first, for messages."""
    comments = {tok.start[0]: (m["value"], tok.line.lstrip().startswith("#"))
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT and (m := _EXPECT.match(tok.string))}
    if not comments:
        return source
    tree = ast.parse(source)
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    ends = {node.end_lineno: node for node in ast.walk(tree) if isinstance(node, ast.stmt)}
    for comment_line in sorted(comments, reverse=True):
        shown, alone = comments[comment_line]
        line = comment_line - 1 if alone else comment_line
        node = ends.get(line)
        line = first_line + comment_line
        if isinstance(node, ast.Expr):
            target = node.value
            printed = isinstance(target, ast.Call) and isinstance(target.func, ast.Name) \
                and target.func.id == "print"
            row, col = target.end_lineno - 1, target.end_col_offset  # type: ignore[operator]
            lines[row] = (lines[row][:col] + f"), {shown!r}, {line})".encode()
                          + lines[row][col:])
            row, col = target.lineno - 1, target.col_offset
            opening = b"__docs_expect_printed__(lambda: (" if printed else b"__docs_expect__(("
            lines[row] = lines[row][:col] + opening + lines[row][col:]
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            row, col = node.end_lineno - 1, node.end_col_offset  # type: ignore[operator]
            check = f"; __docs_expect__({node.targets[0].id}, {shown!r}, {line})"
            lines[row] = lines[row][:col] + check.encode() + lines[row][col:]
        else:
            raise BlockFailed(f"line {line}: a `# ->` comment must end an expression or an "
                              "assignment to one name (or stand alone on the line after one), "
                              "whose value it shows")
    return b"".join(lines).decode()


def run_python(block: Block, names: dict[str, Any], scratch: Path) -> dict[str, Any]:
    from pytest_examples import CodeExample
    from pytest_examples.config import ExamplesConfig
    from pytest_examples.run_code import run_code

    example = CodeExample.create(block.source, path=block.page, start_line=block.line,
                                 prefix=block.language)
    python_file = scratch / f"{example.module_name}.py"
    python_file.write_text(with_value_checks(block.source, block.line), encoding="utf-8")
    check_prints = "#>" in block.source
    insert_print, new_names = run_code(
        example=example, python_file=python_file, loader=None,
        config=ExamplesConfig(line_length=100), enable_print_mock=check_prints,
        print_callback=None, include_print=None,
        module_globals={**names, "__docs_expect__": _expect,
                        "__docs_expect_printed__": _expect_printed}, call=None)
    if check_prints:
        expected = insert_print.updated_print_statements(example)
        if expected is not None:
            raise BlockFailed("what its print calls printed is not what its #> lines show; "
                              f"the block as it printed:\n{expected}")
    return new_names


def run_pycon(block: Block, names: dict[str, Any]) -> None:
    globs = {**names, "__name__": "__main__"}
    source = block.source.replace("…", "...")
    test = doctest.DocTestParser().get_doctest(source, globs, block.page.name, str(block.page),
                                               block.line)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=report.write, clear_globs=False)
    names.update({k: v for k, v in globs.items() if not k.startswith("__")})
    if runner.failures:
        raise BlockFailed(report.getvalue())


def _bash(script: str, log: Path) -> tuple[int, str]:
    # Output goes to a file, not a pipe: a server a block starts with `&` keeps a pipe open.
    with log.open("w+", encoding="utf-8", errors="replace") as out:
        rc = subprocess.run(["bash", "-e", "-c", script],
                            stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT).returncode
        out.seek(0)
        printed = out.read()
    sys.stdout.write(printed)
    return rc, printed


def run_bash(block: Block, scratch: Path) -> None:
    rc, printed = _bash(block.source, scratch / "bash.log")
    if rc:
        raise BlockFailed(f"bash exited {rc}; it printed:\n{printed[-4000:]}")


def console_commands(source: str) -> list[tuple[str, str]]:
    """``(command, output shown)`` for each ``$ `` line (``\\`` continues a command)."""
    commands: list[list[str]] = []
    continued = False
    for line in source.splitlines():
        if line.startswith("$ ") or (continued and commands):
            text = line[2:] if line.startswith("$ ") and not continued else line
            if continued:
                commands[-1][0] += "\n" + text
            else:
                commands.append([text, ""])
            continued = text.endswith("\\")
        elif commands:
            commands[-1][1] += line + "\n"
        elif line.strip():
            raise BlockFailed(f"console block line {line!r} comes before any `$ ` command")
    return [(command, shown) for command, shown in commands]


def run_console(block: Block, scratch: Path) -> None:
    for command, shown in console_commands(block.source):
        print(f"$ {command}")
        rc, printed = _bash(command, scratch / "console.log")
        if shown.strip():
            if not matches(shown, printed):
                raise BlockFailed(f"`$ {command}` printed (exit {rc}):\n{printed}\n"
                                  f"but the page shows:\n{shown}")
        elif rc:
            raise BlockFailed(f"`$ {command}` exited {rc}; it printed:\n{printed[-4000:]}")


def _traceback(exc: BaseException) -> str:
    """The traceback of a block's exception. pytest-examples gives the block's frames the page's
    file and lines, frames the standard formatter cannot always position (Python 3.11), so the
    frames are written out here: file, line, function and the line's text."""
    lines = ["Traceback (most recent call last):"]
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
        text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
        if text:
            lines.append(f"    {text}")
        tb = tb.tb_next
    lines.extend(traceback.format_exception_only(type(exc), exc))
    return "\n".join(line.rstrip("\n") for line in lines)


def run_page(page: Path) -> dict[str, Any]:
    blocks = page_blocks(page)
    sys.modules["__main__"] = types.ModuleType("__main__")  # the page's, not this runner's
    names: dict[str, Any] = {}
    ran: list[int] = []
    with tempfile.TemporaryDirectory(prefix="docs-scratch-") as tmp:
        scratch = Path(tmp)
        for block in blocks:
            if not block.runs:
                continue
            print(f"--- {block.page.name}:{block.line} ({block.language})", flush=True)
            try:
                if block.language == "python":
                    names.update(run_python(block, names, scratch))
                elif block.language == "pycon":
                    run_pycon(block, names)
                elif block.language == "bash":
                    run_bash(block, scratch)
                else:
                    run_console(block, scratch)
            except BaseException as exc:  # pytest-examples fails with pytest's outcome exceptions
                why = str(exc) if isinstance(exc, BlockFailed) else _traceback(exc)
                return {"ran": ran, "failed": {"line": block.line, "language": block.language,
                                               "why": why}}
            finally:
                sys.stdout.flush()
                main = sys.modules.get("__main__")
                if main is not None:  # a later block's pull finds classes the page defined
                    main.__dict__.update(names)
            ran.append(block.line)
    return {"ran": ran, "failed": None}


def main() -> None:
    page, report = Path(sys.argv[1]), Path(sys.argv[2])
    result = run_page(page)
    report.write_text(json.dumps(result), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a page's leftover threads (a server's client pool) must not hold the exit


if __name__ == "__main__":
    main()
