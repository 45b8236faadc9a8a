"""The code the docs show runs as shown."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

README_RUN = """
import sys
sys.path.insert(0, "examples")
import torch
from transformers import BertConfig, BertForSequenceClassification
from nlp_example import MODELS, Pairs, make_pairs, pad_to_longest

def MyModel():
    return BertForSequenceClassification(BertConfig(num_labels=2, **MODELS["tiny"]))

train_loader = torch.utils.data.DataLoader(Pairs(make_pairs(64, 0)), batch_size=16, collate_fn=pad_to_longest)
eval_loader = torch.utils.data.DataLoader(Pairs(make_pairs(32, 1)), batch_size=16, collate_fn=pad_to_longest)
total_updates = 3
before = [p.detach().clone() for p in MyModel().parameters()]
code = open("README.md").read().split("```python\\n")[1].split("```")[0]
exec(code)
assert 0 <= int(correct) <= 32
assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), "weights not copied back"
print("README OK", run.steps, run.updates)
"""


@pytest.mark.slow
def test_the_readme_example_runs_as_shown():
    env = {**os.environ, "PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1"}
    env.pop("CPU_NUM_DEVICES", None)
    out = subprocess.run(
        [sys.executable, "-c", README_RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "README OK 12 3" in out.stdout  # 3 epochs of 4 micro-batches, an update every 4
