"""Builds the one compiled part of aligner (the fused metric kernel behind `align compare`, see _kernel.c) and ships
the top-level `mappings/` folder inside the package as `aligner.mappings`, so a wheel carries its rules."""
from setuptools import Extension, find_packages, setup

# Reassociation lets the sums vectorize; NaN/Inf stay honoured (no -ffinite-math-only), and no fused multiply-add,
# so that |a - b| <= atol + rtol * |b| rounds as torch.isclose does.
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math",
         "-ffp-contract=off"]

setup(
    packages=find_packages(include=["aligner", "aligner.*"]) + ["aligner.mappings"],
    package_dir={"aligner.mappings": "mappings"},
    package_data={"aligner.mappings": ["*.yaml"]},
    ext_modules=[Extension("aligner.metrics._kernel", ["aligner/metrics/_kernel.c"], extra_compile_args=FLAGS,
                           extra_link_args=["-pthread"])],
)
