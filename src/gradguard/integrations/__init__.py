"""Integrations with where users work: pytest, Lightning, Hugging Face Trainer, torchrun.

Each submodule imports its library only when used; ``gradguard.integrations`` itself imports nothing heavy.
"""
