"""`python -m aligner.cli`: the same as the `align` command."""
from aligner.cli import main

main()
