"""`python -m criu_gpushare.cli`: the same as the `criu-gpushare` command."""
from . import main

main(prog_name="criu-gpushare")
