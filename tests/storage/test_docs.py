"""The storage guide's examples run, and the format page's example bytes are right."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def test_every_example_of_the_storage_guide_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks("storage.md")
    assert len(blocks) > 8
    for number, block in enumerate(blocks):
        try:
            exec(compile(block, f"storage.md block {number}", "exec"), {})
        except Exception as error:
            pytest.fail(f"storage.md block {number} failed: {error!r}\n{block}")


def test_the_format_example_writes_the_bytes_the_page_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = (DOCS / "format.md").read_text()
    (example,) = _python_blocks("format.md")
    exec(example, {})
    dump = re.findall(r"^0000[0-9a-f]{4}: ((?:[0-9a-f]{2,4} ?)+)", page, flags=re.M)
    assert bytes.fromhex("".join(line.replace(" ", "") for line in dump)) == \
        (tmp_path / "pets.msgpack").read_bytes()
    for suffix in ("offsets", "keys", "key_hashes"):
        shown = re.search(rf"^pets\.msgpack\.{suffix}: +(.*)$", page, flags=re.M).group(1)
        assert bytes.fromhex(shown.replace(" ", "")) == (tmp_path / f"pets.msgpack.{suffix}").read_bytes()
    md5 = re.search(r"^pets\.msgpack\.md5: +(\w+)  pets\.msgpack$", page, flags=re.M).group(1)
    assert (tmp_path / "pets.msgpack.md5").read_text().startswith(f"{md5}  pets.msgpack\n")
