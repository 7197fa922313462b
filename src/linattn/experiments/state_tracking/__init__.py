"""State tracking: word problems of finite groups, trained and tested for length.

- ``tasks``: the groups (parity, mod3, mod5, S3, A5, S5) and the data (``StateTask``).
- ``sweep``: mechanisms, presets ``smoke``/``default``/``paper``, one cell's training and tests,
  the resumable sweep (``run_sweep``).
- ``results``: the aggregation over seeds, the table and the figure.
- ``cli``: the ``linattn state-tracking`` command.

The constructions that prove what these models can learn are lines of ``linattn verify``
(``linattn.reference.state_tracking``).
"""
