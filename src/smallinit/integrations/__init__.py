"""smallinit inside the trainers people already use, each a thin room over the one Monitor
(smallinit.monitor) that imports its engine only when imported itself:

* ``smallinit.integrations.hf``: transformers' ``Trainer`` (``watch(trainer)``, ``model_init``); extra ``hf``
* ``smallinit.integrations.lightning``: a Lightning ``Callback``; extra ``lightning``
* ``smallinit.integrations.titan``: torchtitan's own init drawing by the γ rule (``gamma_param_init``); extra
  ``titan``
* ``smallinit.integrations.olmo``: an OLMo-core ``Callback`` (γ on a fresh run, the Monitor); extra ``olmo``
* ``smallinit.integrations.litgpt``: litgpt's ``initialize_weights`` hook by the γ rule; extra ``litgpt``

A plain loop (and torchtitan's and litgpt's, which have no callback API: docs/integrations.md) calls
``smallinit.Monitor``.
"""
