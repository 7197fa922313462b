"""One module per check, table or figure of the spec, plus benchmarks; each a `linattn` command.

Also the scripts built on ``linattn.distributed``: ``cp_bytes`` (the ``linattn cp-bytes``
command), ``mqar.data_parallel`` (data-parallel MQAR training under torchrun) and ``launch``
(local ranks the way torchrun starts them, for those and the tests).
"""
