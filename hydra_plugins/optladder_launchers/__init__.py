"""The project's Hydra launchers: Hydra looks for launchers under the hydra_plugins namespace only."""
