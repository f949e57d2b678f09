"""Long-video benchmark: methods x visual lengths, measured through vLLM (`sparrow bench`)."""
