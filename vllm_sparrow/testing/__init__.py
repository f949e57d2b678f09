"""Test helpers for vllm-sparrow: tiny offline target models and fixtures."""
