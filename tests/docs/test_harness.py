"""The docs test's own rules: which blocks run, what a skip marker is, how shown output is
checked, and that a failing block is named by its page and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import PageError, page_blocks
from tests.docs.pagerun import BlockFailed, console_commands, matches, with_value_checks
from tests.docs.test_manual import run_page

PAGE = '''# A page

```python
x = 1 + 1  # -> 2
```

<!-- docs-test: skip (needs a GPU) -->
```python
raise SystemExit("never runs")
```

??? note "Setup"

    ```bash
    echo indented
    ```

```yaml
not: run
```

```console
$ echo hello
hello
```
'''


def test_blocks_in_page_order_with_their_lines_languages_and_skip_reasons(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    blocks = page_blocks(page)
    assert [(b.line, b.language, b.skip, b.runs) for b in blocks] == [
        (3, "python", None, True), (8, "python", "needs a GPU", False),
        (14, "bash", None, True), (18, "yaml", None, False), (22, "console", None, True)]
    assert blocks[2].source == "echo indented\n"


@pytest.mark.parametrize("marker", ["<!-- docs-test: skip -->", "<!-- docs-test: skip () -->",
                                    "<!-- docs-test: skp (x) -->"])
def test_a_marker_without_a_reason_or_misspelt_is_an_error(tmp_path: Path, marker: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"{marker}\n```python\npass\n```\n")
    with pytest.raises(PageError, match="malformed docs-test marker"):
        page_blocks(page)


def test_an_unclosed_fence_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\npass\n")
    with pytest.raises(PageError, match="never closed"):
        page_blocks(page)


def test_shown_output_matches_with_ellipses_only_where_written() -> None:
    assert matches("pushed m:v1 sha256:…", "pushed m:v1 sha256:abc\nuploaded 1 of 1 shard\n")
    assert matches("a ... c", "a b c")
    assert not matches("pushed m:v1", "pushed m:v2")
    assert not matches("a\nb", "a")


def test_value_comments_become_checks_on_the_same_lines() -> None:
    source = "x = 2  # -> 2\nx + 1  # -> 3\n[x,\n x]\n# -> [2, 2]\nprint(x)  # plain\n"
    checked = with_value_checks(source, 10)
    assert checked.count("\n") == source.count("\n")
    names: dict[str, object] = {}
    calls: list[tuple[object, str, int]] = []
    exec(checked, {"__docs_expect__": lambda *a: calls.append(a)}, names)
    assert calls == [(2, "2", 11), (3, "3", 12), ([2, 2], "[2, 2]", 15)]
    with pytest.raises(BlockFailed, match="line 11: a `# ->` comment must end an expression"):
        with_value_checks("for i in range(2):  # -> 1\n    pass\n", 10)


def test_console_commands_and_their_shown_output() -> None:
    block = "$ registry push a \\\n    b\npushed a:v1\n$ registry ls\n"
    assert console_commands(block) == [("registry push a \\\n    b", "pushed a:v1\n"),
                                       ("registry ls", "")]


@pytest.mark.parametrize(("block", "why"), [
    ("```python\nx = 1\nx + 1  # -> 3\n```\n", "page.md:3: the python block starting on this "
     "line failed:\nline 5 shows `# -> 3` but the value is 2"),
    ("```pycon\n>>> 1 + 1\n3\n```\n", "page.md:3: the pycon block"),
    ("```bash\nfalse\n```\n", "page.md:3: the bash block starting on this line failed:\nbash "
     "exited 1"),
    ("```console\n$ echo hi\nho\n```\n", "page.md:3: the console block"),
    ("```python\nraise KeyError('gone')\n```\n", "KeyError: 'gone'"),
    ("```python\nprint(2)\n# -> 3\n```\n", "line 5 shows `# -> 3` but it printed '2\\n'"),
    ("```python\nprint(1)\n#> 2\n```\n", "what its print calls printed is not what its #> "),
])
def test_a_failing_block_is_named_by_page_and_line(tmp_path: Path, block: str, why: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n{block}")
    run = run_page(page)
    assert run.failure is not None and why in run.failure.replace(str(tmp_path) + "/", ""), \
        run.failure


def test_blocks_share_one_namespace_and_a_clean_registry(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('''```python
import os
from torch import nn
class Net(nn.Module):
    pass
home = os.environ["REGISTRY_HOME"]
print(1 + 1)
#> 2
```

```python
print([1, 2])  # -> [1, 2]
```

```pycon
>>> import sys
>>> sys.modules["__main__"].Net is Net, os.listdir(home), "REGISTRY_URI" in os.environ
(True, [], False)
```

```console
$ test "$(pwd)" != "$HOME" && echo clean
clean
```
''')
    run = run_page(page)
    assert run.failure is None, run.failure
    assert run.ran == [1, 11, 15, 21]
