"""kvstored as the KV-cache tier of inference engines, through their own plug-in points.

One module per engine, each loaded by the engine from its own configuration (no fork, no
patch), each importing its engine only when the engine loads it:

- :mod:`kvstored.integrations.sglang`: a HiCache L3 storage backend
  (``--hicache-storage-backend dynamic``);
- :mod:`kvstored.integrations.lmcache`: an LMCache remote storage plugin
  (``remote_storage_plugins``), which also serves vLLM through ``LMCacheConnectorV1``;
- :mod:`kvstored.integrations.vllm`: a secondary tier under vLLM's ``OffloadingConnector``.

What they share: :mod:`~kvstored.integrations.namespace` (the key prefix that keeps models,
dtypes, layouts and ranks apart) and :mod:`~kvstored.integrations.objects` (the one seam
where bytes move between an engine's buffers and the store). ``docs/integrations.md``
shows each engine's flags and keys.
"""
