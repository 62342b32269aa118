"""Adapters for the stacks dtok is embedded in: transformers, SGLang."""
