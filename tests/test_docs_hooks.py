"""The docs' Markdown hook: doctest lines become code blocks, Sphinx roles become code or links."""

import importlib.util
from pathlib import Path

import markdown

HOOKS = Path(__file__).resolve().parents[1] / "docs" / "hooks.py"


def _render(text: str) -> str:
    spec = importlib.util.spec_from_file_location("fpipe_docs_hooks", HOOKS)
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return markdown.markdown(text, extensions=["pymdownx.highlight", "pymdownx.superfences",
                                             hooks.DoctestBlocks()])


def test_doctest_lines_become_a_code_block_and_fences_are_left_alone():
    html = _render("Text.\n\n>>> 1 + 1\n2\n\n```python\n>>> kept\n```\n")
    assert html.count("<pre") == 2 and "<blockquote>" not in html
    assert '<span class="gp">&gt;&gt;&gt; </span>' in html  # a console prompt, as pycon


def test_sphinx_roles_become_code_and_fpipe_paths_become_reference_links():
    html = _render("See :class:`~fpipe.errors.FormatError`, :func:`threads` and :meth:`dict.get`.")
    assert ":class:" not in html and ":func:" not in html and ":meth:" not in html
    # a full fpipe path is left as an autorefs reference, which mkdocs-autorefs resolves
    assert "[<code>FormatError</code>][fpipe.errors.FormatError]" in html
    assert "<code>threads</code>" in html and "<code>dict.get</code>" in html


def test_a_name_that_fpipe_re_exports_links_to_the_module_that_documents_it():
    html = _render("Use :func:`fpipe.threads`, :meth:`fpipe.Stream.start` or :data:`fpipe.nothing`.")
    assert "[<code>fpipe.threads</code>][fpipe.stream.parallel.stages.threads]" in html
    assert "[<code>fpipe.Stream.start</code>][fpipe.stream.core.Stream.start]" in html
    assert "[<code>fpipe.nothing</code>][fpipe.nothing]" in html  # unknown: left to autorefs
