"""Trace replay: a request trace sent to a live store as an inference engine sends it,
every byte read back checked, and the hit rates measured by tier set beside what the
simulator predicts for the same store (docs/replay.md).

Modules, one concept each:

- :mod:`.keys`: prefix-chained block keys; :mod:`.values`: the value of each key;
- :mod:`.workload`: a trace as engine requests;
- :mod:`.runner`: the workers that send them, and what each request met;
- :mod:`.predict`: the store's capacities in blocks, and the simulator's run;
- :mod:`.report`: measurement beside prediction, as a document; :mod:`.tables`,
  :mod:`.plots`, :mod:`.page`: the same for a terminal, a PNG, a page;
- :mod:`.session`: one replay end to end;
- :mod:`.embedded`: a fresh ``kvstored up`` for an experiment;
- :mod:`.multiturn`: the multi-round experiment.

The command is ``kvstore replay`` (``kvstored.cli.replay_cmd``); ``make demo`` is
``kvstored.demo``. Nothing here changes the store: it is one more client.
"""
