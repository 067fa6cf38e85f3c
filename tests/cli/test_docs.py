"""``docs/cli.md`` shows every subcommand's ``--help`` exactly as the command prints it.

After changing an option or a help text, regenerate the page's help blocks with
``python -m tests.cli.test_docs`` (run with the Python version the page names).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fpipe.cli import build_parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
# A marker, then the block generated for it (absent until the first generation).
HELP_BLOCK = re.compile(r"<!-- help: (\S+) -->\n(?:\n```text\n.*?\n```\n)?", re.S)
GENERATED_WITH = re.compile(r"\(Python (\d+)\.(\d+)\) -->")
WIDTH = "100"


def help_texts() -> dict[str, str]:
    """The help of ``fpipe`` and of each subcommand, formatted for a 100-column terminal."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        commands = parser._subparsers._group_actions[0].choices
        return {"fpipe": parser.format_help(),
                **{name: command.format_help() for name, command in commands.items()}}
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def render(page: str, texts: dict[str, str]) -> str:
    """``page`` with each help marker followed by the current help text."""
    def block(match: re.Match) -> str:
        return f"<!-- help: {match[1]} -->\n\n```text\n{texts[match[1]].rstrip()}\n```\n"
    return HELP_BLOCK.sub(block, page)


def test_the_page_has_a_section_for_every_subcommand():
    documented = HELP_BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    assert documented == list(help_texts())


def test_every_subcommand_help_ends_with_examples():
    for name, text in help_texts().items():
        if name != "fpipe":
            examples = text.split("\nexamples:\n", 1)[1]
            assert examples.lstrip().startswith(f"fpipe {name}"), name


def test_the_page_shows_the_current_help():
    page = PAGE.read_text(encoding="utf-8")
    version = tuple(map(int, GENERATED_WITH.search(page).groups()))
    if version != sys.version_info[:2]:
        pytest.skip(f"argparse formats help differently across versions; the page was made "
                    f"with Python {version[0]}.{version[1]}")
    assert page == render(page, help_texts()), "run: python -m tests.cli.test_docs"


def test_the_command_imports_neither_torch_nor_pillow_before_a_command_needs_them(tmp_path):
    from .conftest import make_dataset

    path = make_dataset(tmp_path / "set.msgpack", 3)
    code = ("import sys; from fpipe.cli import main; main(['info', sys.argv[1]]); "
            "print(' '.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                            text=True, check=True).stdout.splitlines()[-1].split()
    assert [name for name in loaded if name.split(".")[0] in ("torch", "PIL")] == []


def test_the_page_is_in_the_site_navigation():
    assert "cli.md" in (PAGE.parents[1] / "mkdocs.yml").read_text(encoding="utf-8")


if __name__ == "__main__":
    page = PAGE.read_text(encoding="utf-8")
    stamp = f"(Python {sys.version_info[0]}.{sys.version_info[1]}) -->"
    PAGE.write_text(render(GENERATED_WITH.sub(stamp, page), help_texts()), encoding="utf-8")
    print(f"updated {PAGE}")
