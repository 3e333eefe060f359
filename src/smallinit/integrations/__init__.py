"""smallinit inside the trainers people already use, each a thin room over the one Monitor
(smallinit.monitor) that imports its engine only when imported itself:

* ``smallinit.integrations.hf``: transformers' ``Trainer`` (``watch(trainer)``, ``model_init``); extra ``hf``
* ``smallinit.integrations.lightning``: a Lightning ``Callback``; extra ``lightning``

A plain loop (and torchtitan, which has no callback API: docs/integrations.md) calls ``smallinit.Monitor``.
"""
