"""The embedded demo: a small Qwen2.5-VL target trained to caption the synthetic video world,
its Sparrow draft and EAGLE-style baseline draft, and the `make demo` run."""
