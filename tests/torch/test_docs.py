"""The complete training example of docs/torch.md, run from the page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "torch.md"


def test_the_training_example_of_the_torch_page_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    [script] = [block for block in blocks if block.startswith('"""Train a small classifier')]
    (tmp_path / "train.py").write_text(script)
    run = "import train; train.write_dataset(200); train.main(epochs=2, batch_size=16)"
    result = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # 200 samples, one rank, two workers of 100: 7 batches of up to 16 each
    lines = [line.split(", mean loss ")[0] for line in result.stdout.splitlines()]
    assert lines == ["rank 0 epoch 0: 14 batches", "rank 0 epoch 1: 14 batches"]
