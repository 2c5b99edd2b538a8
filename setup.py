"""Builds the one compiled part of aligner: the fused metric kernel behind `align compare` (see _kernel.c)."""
from setuptools import Extension, setup

# Reassociation lets the sums vectorize; NaN/Inf stay honoured (no -ffinite-math-only), and no fused multiply-add,
# so that |a - b| <= atol + rtol * |b| rounds as torch.isclose does.
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math",
         "-ffp-contract=off"]

setup(ext_modules=[Extension("aligner.compare._kernel", ["aligner/compare/_kernel.c"], extra_compile_args=FLAGS)])
