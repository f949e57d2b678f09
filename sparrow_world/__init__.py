"""The kit around vllm-sparrow, apart from the product: the synthetic video world (`world`), the
demo models made from it (`demo`: `sparrow demo`), the long-video benchmark (`bench`:
`sparrow bench`), and the tiny offline targets the demo and the tests build (`tiny_targets`).

It imports the product (`vllm_sparrow`); the product never imports it. Its commands reach the
`sparrow` CLI through the `vllm_sparrow.commands` entry point (commands.py).
"""
