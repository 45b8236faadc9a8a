"""A corpus of real public training scripts, each ported to xlapipe and checked against itself in eager PyTorch.

Each module holds one script, written twice:

- ``eager(args)``: the script's own training loop as its authors wrote it (its
  learning-rate schedule, gradient accumulation, clipping, data order,
  checkpoint cadence), in plain PyTorch on the CPU;
- ``ported(pipeline, args)``: the same script ported to xlapipe as
  docs/porting.md says (``TrainingSetup``, ``session``, ``run.batches``,
  ``run.step``, ``checkpoint.save``/``restore``, ``run.updated``, ``run.epoch``),
  keeping the script's own quirks.

Both return a :class:`corpus.common.Result`. The scripts, and the upstream
commit each was read at:

- ``nanogpt``: karpathy/nanoGPT ``train.py`` and ``model.py``'s GPT, at
  3adf61e154c3fe3fca428ad6bc3818b27a3b8291;
- ``glue``: huggingface/transformers
  ``examples/pytorch/text-classification/run_glue_no_trainer.py``, at
  a22a4378d97d06b7a1d9abad6e0086d30fdea199;
- ``mnist``: pytorch/xla ``test/test_train_mp_mnist.py``, at
  41398bfff334fc8d3b1c00be6ea8cc5411f6d6bf.

Nothing is downloaded: the data are tiny and generated from seeds, the models
scaled down. The code here is a port written for these tests (the upstream
files were read, not copied); each module says what it keeps and what it leaves out.
``matrix.py`` lists the practice subsets each script can take;
``tests/test_corpus.py`` runs them.
"""
