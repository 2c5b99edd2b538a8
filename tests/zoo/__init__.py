"""Real third-party model pairs (torch zoo model vs MindSpore zoo model) for localization tests.

Importing this package installs two test-side shims (see torch_compat.py and ms_compat.py). Install the zoo with
scripts/install_zoo.sh (pins in requirements-zoo.txt).
"""
