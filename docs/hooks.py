"""MkDocs hooks: render docstrings' ``>>>`` examples as code and their Sphinx roles as links.

Docstrings carry runnable examples in plain doctest form; in Markdown a line starting with
``>`` is a block quote. One Markdown preprocessor fences each run of doctest lines (up to the
next blank line) as a ``pycon`` code block, outside existing fences. Another turns Sphinx
cross-reference roles (``:class:`~fpipe.errors.FormatError```) into code: a link to the API
reference for a full ``fpipe.`` path (where the object is defined, so ``fpipe.threads`` links to
``fpipe.stream.parallel.stages.threads``), plain code for other names.
"""

from __future__ import annotations

import re

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


_ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):`(~?)([\w.]+)`")


def _role_as_code(match: re.Match) -> str:
    short, target = match.groups()
    shown = target.rsplit(".", 1)[-1] if short else target
    return f"[`{shown}`][{defined_at(target)}]" if target.startswith("fpipe.") else f"`{shown}`"


def defined_at(path: str) -> str:
    """Where the API reference documents ``path``: the module that defines the object, as
    ``fpipe.threads`` is documented as ``fpipe.stream.parallel.stages.threads``. A path that does
    not resolve to a class or function is kept as it is."""
    import importlib

    module, _, rest = path.partition(".")
    obj = importlib.import_module(module)
    try:
        for name in rest.split("."):
            obj = getattr(obj, name)
    except AttributeError:
        return path
    owner = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not (isinstance(owner, str) and isinstance(qualname, str) and owner.startswith("fpipe")):
        return path
    return f"{owner}.{qualname}"


class _SphinxRoles(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return [_ROLE.sub(_role_as_code, line) for line in lines]


class DoctestBlocks(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        # before the fenced-code preprocessors (priority 25), which then see the fences
        md.preprocessors.register(_DoctestBlocks(md), "fpipe_doctest_blocks", 40)
        md.preprocessors.register(_SphinxRoles(md), "fpipe_sphinx_roles", 39)


def on_config(config):
    config.markdown_extensions.append(DoctestBlocks())
    return config
