"""Bridges to the Hugging Face ecosystem: transformers export / γ-init import, and lm-evaluation-harness."""
