"""Every code block of the tutorials in ``docs/tutorials/`` runs, and prints what the page shows.

A tutorial page may hold four kinds of fenced block, and nothing else:

- ``>>>`` examples (```` ```python ```` or ```` ```pycon ````), run by pytest's
  ``--doctest-glob=*.md``;
- files, ```` ```python title="train.py" ```` (any language with a ``title``), written into
  an empty folder under that name when the page reaches them;
- ```` ```bash ```` blocks, run in that folder in page order, with the interpreter's ``bin``
  folder first on ``PATH`` (so ``python``, ``fpipe`` and ``torchrun`` are this environment's);
- ```` ```text ```` (or ```` ```text title="output" ````) right after a bash block: what
  that block prints on stdout, where ``...`` stands for any text.

Beyond the printed text, a page's check below tests what its output means (equal batch
counts per rank, accuracy above chance, ...). A run that hangs fails after ``TIMEOUT``.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
PAGES = sorted(path.name for path in TUTORIALS.glob("*.md"))
TIMEOUT = 240  # seconds for one bash block; the slowest takes a few seconds

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
TITLE = re.compile(r'\btitle="([^"]*)"')


@dataclass
class Block:
    """A fenced code block: its first line's number, language, title and text."""

    line: int
    language: str
    title: str | None
    text: str

    @property
    def where(self) -> str:
        return f"line {self.line} ({self.language or 'no language'})"


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, with their indentation removed."""
    found, lines = [], page.splitlines()
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        number += 1
        if opening is None:
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        body, start = [], number
        while number < len(lines) and lines[number].strip() != fence:
            body.append(lines[number][len(indent):] if lines[number].startswith(indent) else lines[number])
            number += 1
        number += 1
        title = TITLE.search(info)
        found.append(Block(start, info.split(" ", 1)[0].strip("{}."), title and title[1],
                           "\n".join(body) + "\n"))
    return found


def kinds(page_blocks: list[Block]) -> list[str]:
    """What the test does with each block: doctest, file, bash, output, or unchecked."""
    found: list[str] = []
    for block in page_blocks:
        if block.language in ("python", "pycon", "py") and block.text.lstrip().startswith(">>>"):
            kind = "doctest"
        elif (block.language == "text" and block.title in (None, "output") and found
              and found[-1] == "bash"):
            kind = "output"
        elif block.title:
            kind = "file"
        elif block.language in ("bash", "sh", "shell"):
            kind = "bash"
        else:
            kind = "unchecked"
        found.append(kind)
    return found


def matches(expected: str, printed: str) -> bool:
    """Whether ``printed`` is ``expected``, where ``...`` in ``expected`` stands for any text;
    trailing spaces and blank lines do not count."""
    def tidy(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
    pattern = ".*?".join(re.escape(part) for part in tidy(expected).split("..."))
    return re.fullmatch(pattern, tidy(printed), flags=re.DOTALL) is not None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment() -> dict[str, str]:
    paths = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    python_paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PATH": os.pathsep.join(filter(None, paths)),
           "PYTHONPATH": os.pathsep.join(filter(None, python_paths)),
           # torchrun: a free port on the loopback address (read from PET_* variables)
           "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(_free_port())}
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _descendants(root: int) -> list[int]:
    """The processes below ``root`` (children, their children ...), read from ``/proc``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue  # /proc/self, /proc/sys ...
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue  # not a process, or one that just ended
        pid = int(entry.name)
        parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended on its own


def _bash(script: str, folder: Path, env: dict[str, str], where: str) -> str:
    """Run ``script`` with ``bash -e`` in ``folder``; its stdout. A hang kills the whole
    process group (torchrun, its ranks and their workers) and fails the test."""
    process = subprocess.Popen(["bash", "-e", "-c", script], cwd=folder, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        # torchrun starts each rank in a session of its own, out of reach of killpg: every
        # descendant is found first (they hold the output pipes open) and killed by its pid
        stuck = _descendants(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        for pid in stuck:
            _kill(pid)
        process.communicate(timeout=60)
        pytest.fail(f"the bash block at {where} did not finish in {TIMEOUT} s:\n{script}")
    assert process.returncode == 0, (f"the bash block at {where} failed with status "
                                     f"{process.returncode}:\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return stdout


def run_page(name: str, folder: Path) -> dict[str, str]:
    """Write the page's files and run its bash blocks in ``folder``, checking each printed
    output against the page; the stdout of each bash block, by its script."""
    page_blocks = blocks((TUTORIALS / name).read_text(encoding="utf-8"))
    env, printed = _environment(), {}
    last = ""
    for block, kind in zip(page_blocks, kinds(page_blocks)):
        if kind == "file":
            (folder / block.title).write_text(block.text, encoding="utf-8")
        elif kind == "bash":
            last = printed[block.text] = _bash(block.text, folder, env, f"{name}:{block.where}")
        elif kind == "output":
            assert matches(block.text, last), (f"{name}:{block.where}: the page shows\n{block.text}"
                                               f"\nbut the block before it printed\n{last}")
    return printed


# --- what the pages' outputs mean --------------------------------------------------------


def _only(printed: dict[str, str], command: str) -> str:
    [output] = [out for script, out in printed.items() if script.strip() == command]
    return output


def check_image_folder(printed: dict[str, str]) -> None:
    epochs = re.findall(r"epoch (\d+): (\d+) batches, mean loss ([\d.]+), validation (\d+)/(\d+) right",
                        _only(printed, "python train.py"))
    assert [int(epoch) for epoch, *_ in epochs] == list(range(6))
    # 180 training samples in batches of 16: 12 batches an epoch
    assert all(int(batches) == 12 for _, batches, *_ in epochs)
    right, total = int(epochs[-1][3]), int(epochs[-1][4])
    # chance is 15 of 60; the page says at least 55
    assert total == 60 and right >= 55, f"{right}/{total} right in the last epoch"


_RANK_LINE = re.compile(r"epoch (\d+), rank (\d+): (\d+) batches, (\d+) samples \((\d+)-(\d+)\), "
                        r"mean loss ([\d.]+|nan)")


def _ranks(output: str) -> dict[int, list[tuple[int, int, int, int, float]]]:
    """Per epoch, each rank's (batches, samples, first, last, loss) in rank order."""
    epochs: dict[int, list] = {}
    for epoch, rank, batches, samples, first, last, loss in _RANK_LINE.findall(output):
        assert int(rank) == len(epochs.setdefault(int(epoch), []))
        epochs[int(epoch)].append((int(batches), int(samples), int(first), int(last), float(loss)))
    return epochs


def check_distributed(printed: dict[str, str]) -> None:
    drop = _ranks(_only(printed, "torchrun --nproc_per_node 2 train.py"))
    assert sorted(drop) == [0, 1] and all(len(ranks) == 2 for ranks in drop.values())
    for ranks in drop.values():
        # equal batch counts on both ranks; together every sample but the last exactly once
        assert [r[:2] for r in ranks] == [(16, 512), (16, 512)]
        assert sorted(r[2:4] for r in ranks) == [(0, 511), (512, 1023)]
        assert all(math.isfinite(r[4]) for r in ranks)
    # set_epoch: the ranks trade their parts from one epoch to the next
    assert [r[2:4] for r in drop[0]] == [r[2:4] for r in reversed(drop[1])]
    pad = _ranks(_only(printed, "torchrun --nproc_per_node 2 train.py --pad --epochs 1"))
    assert [r[:2] for r in pad[0]] == [(17, 513), (17, 513)]
    assert sorted(r[2:4] for r in pad[0]) == [(0, 512), (512, 1024)]
    alone = _ranks(_only(printed, "python train.py --epochs 1"))
    assert [r[:4] for r in alone[0]] == [(33, 1025, 0, 1024)]
    _check_packed(printed)


def _packed(output: str) -> dict[int, list[tuple[int, ...]]]:
    """``{epoch: [(batches packed, steps, repeated) of each rank]}`` as pack.py prints them."""
    epochs: dict[int, list[tuple[int, ...]]] = {}
    for epoch, *figures in re.findall(r"epoch (\d+), rank \d+: (\d+) batches packed, (\d+) "
                                      r"steps trained \((\d+) repeated\)", output):
        epochs.setdefault(int(epoch), []).append(tuple(map(int, figures)))
    return epochs


def _check_packed(printed: dict[str, str]) -> None:
    drop = _packed(_only(printed, "torchrun --nproc_per_node 2 pack.py"))
    pad = _packed(_only(printed, "torchrun --nproc_per_node 2 pack.py --pad"))
    assert sorted(drop) == sorted(pad) == [0, 1]
    assert any(len({made for made, _, _ in ranks}) > 1 for ranks in drop.values())  # uneven
    for epoch, ranks in drop.items():
        made = [r[0] for r in ranks]
        assert [r[1:] for r in ranks] == [(min(made), 0)] * 2  # every rank: the shortest count
        assert [r[0] for r in pad[epoch]] == made  # the same epochs, packed the same way
        assert [r[1:] for r in pad[epoch]] == [(max(made), max(made) - m) for m in made]
    alone = _packed(_only(printed, "python pack.py"))
    assert all(made == steps and not repeated for [(made, steps, repeated)] in alone.values())


def check_object_storage(printed: dict[str, str]) -> None:
    trained = _only(printed, "source s3.env\npython train.py")
    epochs = re.findall(r"epoch (\d): (\d+) different samples, accuracy ([\d.]+)", trained)
    assert [(e, int(n)) for e, n, _ in epochs] == [("0", 20000), ("1", 20000)]
    assert float(epochs[1][2]) > 0.4, "better than chance (0.25) after an epoch"
    blocks, mib = re.search(r"cache: (\d+) blocks, ([\d.]+) MiB", trained).groups()
    assert int(blocks) >= 8 and float(mib) <= 64  # several blocks, within the budget


CHECKS = {"image-folder.md": check_image_folder, "distributed.md": check_distributed,
          "object-storage.md": check_object_storage}


# --- tests -------------------------------------------------------------------------------


def test_the_block_reader():
    page = ('text\n```python title="a.py"\nx = 1\n```\n\n!!! note\n    ```bash\n    ls\n    ```\n'
            "    ```text\n    a.py\n    ```\n```python\n>>> 1\n1\n\n```\n```yaml\nk: v\n```\n"
            '```bash\nls\n```\n```text title="output"\na.py\n```\n```text title="b.txt"\nb\n```\n')
    found = blocks(page)
    assert [(b.language, b.title, b.text) for b in found] == [
        ("python", "a.py", "x = 1\n"), ("bash", None, "ls\n"), ("text", None, "a.py\n"),
        ("python", None, ">>> 1\n1\n\n"), ("yaml", None, "k: v\n"), ("bash", None, "ls\n"),
        ("text", "output", "a.py\n"), ("text", "b.txt", "b\n")]
    assert kinds(found) == ["file", "bash", "output", "doctest", "unchecked", "bash", "output", "file"]
    assert matches("epoch 0: loss ...\ndone\n", "epoch 0: loss 1.25  \ndone\n\n")
    assert not matches("epoch 0: loss ...\ndone", "epoch 0: loss 1.25\ndone twice")


def test_the_pages_with_checks_exist():
    assert set(CHECKS) <= set(PAGES)


@pytest.mark.parametrize("name", PAGES)
def test_every_block_on_a_tutorial_page_is_run(name):
    page_blocks = blocks((TUTORIALS / name).read_text(encoding="utf-8"))
    unchecked = [block.where for block, kind in zip(page_blocks, kinds(page_blocks))
                 if kind == "unchecked"]
    assert not unchecked, (f"{name}: blocks that no test runs (make them doctests, titled files, "
                           f"bash blocks or the text output right after a bash block): {unchecked}")


@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES)
def test_tutorial_runs_and_prints_what_the_page_shows(name, tmp_path):
    started = time.time()
    try:
        printed = run_page(name, tmp_path)
    finally:
        _stop_server(tmp_path / "weed.pid")
        _remove_dead_weed_sockets(made_since=started)
    if name in CHECKS:
        CHECKS[name](printed)


def _stop_server(pid_file: Path) -> None:
    """Stop a server that a page started in the background (when a later block failed before
    the page's own last block could stop it), and wait until it has ended."""
    try:
        pid = int(pid_file.read_text())
        os.killpg(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return
    deadline = time.monotonic() + 60
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (an orphan that has ended may stay a zombie for a while)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _remove_dead_weed_sockets(made_since: float) -> None:
    """weed makes its gRPC and S3 sockets in /tmp whatever TMPDIR says, and leaves them when it
    is killed: remove those made while the page ran once no server listens on them. (A killed
    server's threads close them a moment after it shows as ended; a live server of another
    test keeps its own, after a wait of a few seconds at most.)"""
    made = [path for path in Path("/tmp").glob("seaweedfs-*.sock")
            if path.stat().st_mtime >= made_since - 1]
    deadline = time.monotonic() + 10
    while made:
        for path in [path for path in made if not _listened_on(path)]:
            path.unlink(missing_ok=True)
            made.remove(path)
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)


def _listened_on(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def test_a_block_that_hangs_fails_the_test_instead(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.TIMEOUT", 1)
    with pytest.raises(pytest.fail.Exception, match="did not finish in 1 s"):
        _bash("sleep 60 & sleep 60", tmp_path, dict(os.environ), "a test")
