"""The README's links lead somewhere and its quick start is the one the docs give."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)


def test_every_relative_link_of_the_readme_names_a_file_of_the_repository():
    targets = [t for t in re.findall(r"\]\(([^)#]+)[^)]*\)", README) if "://" not in t]
    assert targets, "the README links to the docs"
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_quick_start_of_the_readme_and_of_getting_started_agree():
    getting_started = (ROOT / "docs" / "index.md").read_text()
    assert _bash_blocks(README)[0] in _bash_blocks(getting_started)
