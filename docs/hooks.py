"""MkDocs hooks: render docstrings' ``>>>`` examples as Python console code.

Docstrings carry runnable examples in plain doctest form; in Markdown a line starting with
``>`` is a block quote. This hook adds a Markdown preprocessor that fences each run of doctest
lines (up to the next blank line) as a ``pycon`` code block, outside existing fences.
"""

from __future__ import annotations

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor


class _DoctestBlocks(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fenced = in_example = False
        indent = ""
        for line in lines:
            stripped = line.lstrip()
            if stripped.startswith(("```", "~~~")) and not in_example:
                fenced = not fenced
            elif not fenced and not in_example and stripped.startswith(">>>"):
                indent, in_example = line[: len(line) - len(stripped)], True
                out.append(f"{indent}```pycon")
            elif in_example and not stripped:
                out.append(f"{indent}```")
                in_example = False
            out.append(line)
        if in_example:
            out.append(f"{indent}```")
        return out


class DoctestBlocks(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        # before the fenced-code preprocessors (priority 25), which then see the fences
        md.preprocessors.register(_DoctestBlocks(md), "fpipe_doctest_blocks", 40)


def on_config(config):
    config.markdown_extensions.append(DoctestBlocks())
    return config
