"""The checkout's entry point, a shim over the `optladder` command's Hydra app: `python run.py [overrides]` is
`optladder run [overrides]`, and `python run.py -m ...` is `optladder sweep ...` (optladder/cli.py)."""
from optladder.cli import cli

if __name__ == "__main__":
    cli()
