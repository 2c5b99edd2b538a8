"""Builds the one compiled part of aligner (the fused metric kernel behind `align compare`, see _kernel.c) and ships
the top-level `mappings/` folder inside the package as `aligner.mappings`, so a wheel carries its rules."""
import os
import shutil

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

# Reassociation lets the sums vectorize; NaN/Inf stay honoured (no -ffinite-math-only), and no fused multiply-add,
# so that |a - b| <= atol + rtol * |b| rounds as torch.isclose does.
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math",
         "-ffp-contract=off"]



class ReplacingBuildExt(build_ext):
    """An in-place build (`make install`, `pip install -e .`) puts the new kernel in place by a rename, never by
    writing into the old file: a process that has the old one mapped (a test run, `align compare`) keeps its pages
    instead of dying on a SIGBUS or running half-written code."""

    def copy_file(self, infile, outfile, *args, **kwargs):
        if not str(outfile).endswith((".so", ".pyd")):
            return super().copy_file(infile, outfile, *args, **kwargs)
        staging = f"{outfile}.{os.getpid()}.tmp"
        shutil.copyfile(infile, staging)
        shutil.copymode(infile, staging)
        os.replace(staging, outfile)
        return outfile, 1


setup(
    cmdclass={"build_ext": ReplacingBuildExt},
    packages=find_packages(include=["aligner", "aligner.*"]) + ["aligner.mappings"],
    package_dir={"aligner.mappings": "mappings"},
    package_data={"aligner.mappings": ["*.yaml"]},
    ext_modules=[Extension("aligner.metrics._kernel", ["aligner/metrics/_kernel.c"], extra_compile_args=FLAGS,
                           extra_link_args=["-pthread"], depends=["aligner/metrics/xxhash.h"])],
)
