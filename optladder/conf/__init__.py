"""Hydra finds the primary config as a module of the package (optladder/cli.py, config_path="conf")."""
