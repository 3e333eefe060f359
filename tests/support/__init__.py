"""What the test files share, imported as ``support.<module>``: tiny configs and run-folder helpers
(``runs``), Hugging Face models from tiny configs (``hf_tiny``), a nanochat-style model (``nanochat_style``), and
the synthetic runs, models and trainers several rooms' tests build (``verdicts``, ``monitor``, ``trainers``,
``report``)."""
