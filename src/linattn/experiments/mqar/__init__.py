"""Multi-query associative recall (MQAR): data, training loop, sweep over mechanisms and widths.

- ``data``: the Zoology generator (``MQARTask``, ``generate``, ``train_batch``, ``eval_set``).
- ``train``: AdamW + cosine schedule, evaluation, exact-resume checkpoints
  (``TrainConfig``, ``train``).
- ``sweep``: presets ``smoke``/``cpu``/``zoology``, the results table and plot (``run_sweep``).
- ``cli``: the ``linattn mqar`` command.
- ``data_parallel``: the same training with ``DistributedDataParallel`` under torchrun.
"""
